"""preflight: seconds-long checks of a host, a patched vllm package and weights against a profile, before a boot
that takes 12 minutes. Each check returns PASS, WARN, FAIL or SKIP with a one-line reason and a fix.

Modules: core (Result, Context, the check registry), nvml (the NVML wrapper), hardware (GPU checks), host (port,
/dev/shm, RAM), model (config shape, weights, partition, KV room, disk), package (stamp, imports), knowledge (vLLM's
flags and env names from its own parser, cached), settings (flags, env, flag combinations, switches, licences),
runner (run them all, print, exit code)."""
