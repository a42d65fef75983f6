"""Mapping tables (YAML) shipped with ms-port; installed as the ``ms_port.mappings`` package."""
