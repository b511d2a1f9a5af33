"""Data shipped with hermes-vllm: dialect definitions and the ChatML chat template."""
