"""kern-mine: Mines a kern-capture dump: passes, token reference, call sites, pointer classes, grid expressions."""

__version__ = "0.2.0"
