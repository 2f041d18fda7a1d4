"""The env vars a patch's code reads, from its added lines (issue 29: preflight knew only the Switch: headers, so
patch 0014's VLLM_EXPERT_OFFLOAD_STAGING and two more FAILed rtxpro6000-1x-offload's env check)."""

from __future__ import annotations

from rigstack.patchenv import env_reads, reader_helpers
from rigstack.stack import load_stack

DIFF = '''diff --git a/vllm/x.py b/vllm/x.py
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,2 +1,12 @@
 import os
+ENV_CACHE = "VLLM_X_CACHE"
+BACKEND = "FLASHMLA_SPARSE"
+def _env_int(name, default):
+    raw = os.environ.get(name, "").strip()
+def settings():
+    cache = _env_int(ENV_CACHE, None)
+    staging = _env_int("VLLM_X_STAGING", 4)
+    on = os.getenv("VLLM_X") == "1" or "VLLM_X_FORCE" in os.environ
+    return os.environ["VLLM_X_DIR"], BACKEND
--- a/docs/x.md
+++ b/docs/x.md
@@ -1 +1,2 @@
+os.environ.get("NOT_CODE_VAR")
'''


def test_reads_through_literals_constants_and_helpers() -> None:
    # A backend name is a string constant too, but nothing reads it from the environment; a .md file is no code.
    assert env_reads(DIFF) == {"VLLM_X_CACHE", "VLLM_X_STAGING", "VLLM_X", "VLLM_X_FORCE", "VLLM_X_DIR"}


def test_the_stack_knows_what_0014_reads_beyond_its_switch_header() -> None:
    stack = load_stack()
    offload = {"VLLM_EXPERT_OFFLOAD_STAGING", "VLLM_EXPERT_OFFLOAD_CACHE", "VLLM_EXPERT_OFFLOAD_GROUPED_MIN_TOKENS"}
    assert offload <= stack.env_reads()
    assert not offload & stack.switches()  # its Switch: header gives none of them as NAME=VALUE


def test_a_patch_calling_an_earlier_patch_s_reader_helper_reads_through_it() -> None:
    # 0019 reads its gather's program count with 0014's _env_int, which 0019's own lines do not define.
    assert "VLLM_X_LATER" not in env_reads(LATER)
    assert env_reads(LATER, reader_helpers(DIFF)) == {"VLLM_X_LATER"}
    stack = load_stack()
    assert {"VLLM_EXPERT_OFFLOAD_PREFETCH_PROGRAMS", "VLLM_EXPERT_OFFLOAD_PREFETCH_BREAK_EVEN"} <= stack.env_reads()


LATER = '''diff --git a/vllm/y.py b/vllm/y.py
--- a/vllm/y.py
+++ b/vllm/y.py
@@ -1 +1,3 @@
 import os
+ENV_LATER = "VLLM_X_LATER"
+later = _env_int(ENV_LATER, 1)
'''
