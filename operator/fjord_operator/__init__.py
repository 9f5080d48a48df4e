"""Fjord's Kubernetes operator: kopf handlers around pure builders and decisions.

Modules: ``builders`` (spec -> Kubernetes objects as plain dicts), ``decisions`` (scaling, draining,
topic reconciliation and autoscaling decisions, all pure), ``status`` (conditions and
observedGeneration), ``settings`` (every default of the operator), ``handlers`` (the kopf
registrations: they only call the pure functions and apply what they return) and ``main``
(``run()``, the entry point of ``fjord operator``).
"""
