"""Matching: rules, mapping tables, transforms, the Plan and its inversion for export."""
