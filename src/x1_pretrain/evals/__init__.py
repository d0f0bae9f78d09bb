"""What the money bought: zero-shot task scores (HellaSwag, ARC, PIQA, WinoGrande) computed as
lm-evaluation-harness 0.4 computes them, from sets fetched offline (``sets.py``)."""
