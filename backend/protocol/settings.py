"""Every COMFYUI_TPU_* environment variable, in one place: its name, its default and what it does.

Three kinds: the operator's (set before starting ComfyUI, or `python -m backend join` on another host), the
ones the controller sets for the workers it starts (never set them by hand), and the tests' and tools'.
Code reads a variable only through its `Setting` here; docs/settings.md lists them all (tests/test_settings.py
checks that no other COMFYUI_TPU_* name is used and that the page lists each one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

OPERATOR, WORKER, TOOLS = "operator", "worker", "tools"


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # the value when unset or empty ("": no value)
    doc: str  # what it does, one or two sentences (docs/settings.md shows it)
    kind: str = OPERATOR

    def raw(self, environ: Mapping[str, str] | None = None) -> str:
        """The value as set (surrounding blanks removed), else the default."""
        env = os.environ if environ is None else environ
        return env.get(self.name, "").strip() or self.default

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        env = os.environ if environ is None else environ
        return bool(env.get(self.name, "").strip())

    def on(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the switch is set to 1 (any other value is off)."""
        return self.raw(environ) == "1"

    def number(self, environ: Mapping[str, str] | None = None) -> float | None:
        """The value as a number (None when unset without a default). A value that is not a number is ignored,
        with a line naming it, in favour of the default: a typo must not stop ComfyUI from loading the pack."""
        value = self.raw(environ)
        try:
            return float(value) if value else None
        except ValueError:
            print(f"comfyui-tpu: ignoring {self.name}={value!r}: not a number", flush=True)
            return float(self.default) if self.default else None

    def set(self, value: str, environ: MutableMapping[str, str] | None = None) -> None:
        (os.environ if environ is None else environ)[self.name] = value

    def pop(self, environ: MutableMapping[str, str] | None = None) -> str | None:
        return (os.environ if environ is None else environ).pop(self.name, None)


ALL: dict[str, Setting] = {}


def _define(name: str, default: str, doc: str, kind: str = OPERATOR) -> Setting:
    setting = Setting("COMFYUI_TPU_" + name, default, doc, kind)
    ALL[setting.name] = setting
    return setting


# ---- the operator's: models and files
ALLOW_PICKLE = _define("ALLOW_PICKLE", "", "=1: also load diffusers folders whose weights are pickle files "
                       "(`.bin`, `.pt`); pickle can run code, so only the operator can allow it. Single model files "
                       "are read as safetensors or GGUF whatever this says.")
ALLOW_ABSOLUTE_PATHS = _define("ALLOW_ABSOLUTE_PATHS", "", "=1: model and file inputs may be absolute paths; by "
                               "default only names inside ComfyUI's model folders are accepted.")

# ---- the operator's: workers
WARM_START = _define("WARM_START", "", "=1: start this host's worker (device auto, one worker) in the background "
                     "when ComfyUI loads the pack, so the first prompt only loads weights.")
WORKER_THREADS = _define("WORKER_THREADS", "", "torch threads per worker process (default: the host's cores "
                         "divided among the CPU workers of one group; torch's own default for one worker).")
WORKER_MEMORY_LIMIT_GB = _define("WORKER_MEMORY_LIMIT_GB", "", "caps each CPU worker's private memory at this "
                                 "many GiB (RLIMIT_DATA): a runaway request fails in the worker, named, instead of "
                                 "swapping the host. Not applied to TPU or CUDA workers. Unset: no cap.")
MAX_MEGAPIXELS = _define("MAX_MEGAPIXELS", "", "the most megapixels one Sample pipeline call may make (one image, "
                          "or a batched batch), replacing the estimate from the worker's memory (docs/troubleshooting"
                          ".md); a size over it is refused before anything runs.")
COMPILE_CACHE = _define("COMPILE_CACHE", "", "the persistent compile cache folder (default: `comfyui-tpu/compile-cache` "
                        "in ComfyUI's user folder when run from ComfyUI, else `~/.cache/comfyui-tpu/compile`).")
PROMPT_CACHE_ENTRIES = _define("PROMPT_CACHE_ENTRIES", "32", "the prompt-embedding cache keeps at most this many "
                               "prompts per worker.")
PROMPT_CACHE_MB = _define("PROMPT_CACHE_MB", "512", "the prompt-embedding cache keeps at most this many MiB of "
                          "embeddings per worker.")
DISABLE_CUDA = _define("DISABLE_CUDA", "", "=1: do not use CUDA devices even when torch sees them (device `auto` "
                       "then picks the TPU or the CPU).")

# ---- the operator's: time bounds (seconds)
START_TIMEOUT = _define("START_TIMEOUT", "180", "seconds a worker group may take to start (every rank says "
                        "hello) before the prompt fails, naming the ranks that did not.")
SILENCE_TIMEOUT = _define("SILENCE_TIMEOUT", "120", "seconds a rank that owes an answer may stay silent (busy "
                          "workers heartbeat every 2 s) before the group is stopped, named; the next run starts "
                          "a fresh group.")
CANCEL_GRACE = _define("CANCEL_GRACE", "10", "after Cancel, seconds a rank may take to stop (silent, or busy in "
                       "one step, VAE pass, load or compile that cannot stop midway) before the group is stopped and "
                       "the node names the rank.")
ERROR_GRACE = _define("ERROR_GRACE", "10", "after one rank fails, seconds its peers get to stop before the group "
                      "is stopped and restarted.")
COLLECTIVE_TIMEOUT = _define("COLLECTIVE_TIMEOUT", "600", "seconds a rank may wait in one collective (the process "
                             "group's timeout): a longer wait means a peer is stuck.")

# ---- the operator's: pod slices and several hosts (docs/pod-slices.md)
HOSTS = _define("HOSTS", "", "the slice's hosts' addresses, this host (worker 0) first, comma-separated; unset or "
                "one address: one host, nothing listens beyond loopback.")
LOCAL_GROUP = _define("LOCAL_GROUP", "", "=1 on a host of a multi-host slice: run groups of this host's own chips "
                      "only (without it, and without HOSTS, such a host's TPU is not used).")
LISTEN = _define("LISTEN", "", "where host 0 listens for the other hosts and their workers (default: the first "
                 "address of HOSTS).")
HOST_PORT = _define("HOST_PORT", "29470", "the port the other hosts join host 0 on.")
CLUSTER_SECRET = _define("CLUSTER_SECRET", "~/.config/comfyui-tpu/cluster-secret", "the cluster secret file, "
                         "readable by its owner only (make it with `python -m backend make-secret`).")
PROCS_PER_HOST = _define("PROCS_PER_HOST", "", "worker processes per host (default: the host's chips; 1 on a CPU "
                         "host).")

# ---- set by the controller for the workers it starts
CONTROLLER = _define("CONTROLLER", "", "the controller's link address, host:port.", WORKER)
SECRET_FILE = _define("SECRET_FILE", "", "a 0600 file holding the group's HMAC key (never the key itself).",
                      WORKER)
STORE = _define("STORE", "", "the torch.distributed FileStore path in the group's 0700 folder (one host).", WORKER)
GROUP_ID = _define("GROUP_ID", "", "`<controller pid>-<token>`: names the group's /dev/shm files.", WORKER)
DEVICE_KIND = _define("DEVICE_KIND", "", "the worker's device: tpu, cuda or cpu.", WORKER)
INLINE_ARRAYS = _define("INLINE_ARRAYS", "", "=1 on another host: arrays go over the link, not through /dev/shm.",
                        WORKER)
AUTOLOAD_WAS_UNSET = _define("AUTOLOAD_WAS_UNSET", "", "=1: the pack set TORCH_DEVICE_BACKEND_AUTOLOAD=0 in "
                             "ComfyUI's process (prestartup), so workers get it unset again.", WORKER)

# ---- tests and tools
SHM_DIR = _define("SHM_DIR", "/dev/shm", "the folder images are handed over in (tests point it elsewhere).", TOOLS)
TEST_MODELS = _define("TEST_MODELS", "", "tests: a folder to build (and keep) the tiny test models in, instead of "
                      "a fresh temporary one per run.", TOOLS)
CACHE = _define("CACHE", "~/.cache/comfyui-tpu", "bench/ and scripts/demo.py: the folder their models and runs are "
                "kept in.", TOOLS)
CHROMIUM = _define("CHROMIUM", "", "scripts/frontend.py: the headless Chromium to drive ComfyUI's web UI with "
                   "(default: chromium-headless-shell or chromium on PATH).", TOOLS)
