"""rigstack: one distribution for serving giant MoE models on odd GPU rigs with a patched, pinned vLLM."""

__version__ = "0.1.0"
