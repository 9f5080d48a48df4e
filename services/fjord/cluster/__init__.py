"""What every side knows about a Fjord cluster's servers without being one, pure and shared.

- :mod:`~fjord.cluster.broker_config`: what ``fjord broker --config`` accepts and a topic's
  effective settings on a broker.
- :mod:`~fjord.cluster.topic_config`: topic configs and the cluster's ``cluster-config`` (the
  controller's keys), validated and described.
- :mod:`~fjord.cluster.replication_config`: the brokers' ``replica.*`` settings.
- :mod:`~fjord.cluster.defaults`: the defaults of those keys and the broker port.
- :mod:`~fjord.cluster.reassignment_plan`: target replica lists for a cluster change.
- :mod:`~fjord.cluster.values`: the value parsing the schemas share.
- :mod:`~fjord.cluster.acl_wire`: ACL bindings and filters to and from their gRPC messages.

The broker and the controller read these; the admin client, the operator, ``fjord local`` and
the CLI use them to check or plan before they ask a server, without importing a service
package. Depends only on ``fjord.errors``, ``fjord.storage`` (log configs),
``fjord.topic_names``, and for the ACL messages ``fjord._proto`` and ``fjord.security``.
"""
