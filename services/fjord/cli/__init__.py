"""The ``fjord`` command line."""
