"""detectors: MindYOLO's networks, and ultralytics' as verify's PyTorch side."""
