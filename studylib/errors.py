"""One error type for every user-facing failure.

The CLI prints ``str(err)`` on one line and exits non-zero, so each message names the problem and
the fix. Raise it for bad input (unknown model or method, malformed file, prompt too long, missing
GPU); let genuine bugs raise whatever they raise.
"""


class StudylibError(Exception):
    """A problem with the user's input or environment, with the fix in the message."""


def require_cuda(what: str) -> None:
    """Raise a clear error when a CUDA-only path is asked for on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise StudylibError(
            f"{what} needs a CUDA GPU, but torch.cuda.is_available() is False on this machine; "
            "use --device cpu (or the 'torch' backend) here, or run on a CUDA machine."
        )
