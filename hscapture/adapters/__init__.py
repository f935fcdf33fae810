"""Engine adapters that feed :class:`hscapture.Producer` (SGLang lives in ``hscapture.sglang``)."""
