"""The precision of a drafter's training matmuls, shared by both trainers (``eagle_train``, ``head_train``)."""

from __future__ import annotations

import contextlib

import torch


def train_precision(choice: str, device) -> str:
    """fp32 or bf16 for training matmuls: ``auto`` picks bf16 on a CPU with native bf16 (amx_bf16 or
    avx512_bf16, where it runs several times faster than fp32) and on CUDA, fp32 elsewhere."""
    from studylib.cpuinfo import cpu_flags

    if choice != "auto":
        return choice
    if torch.device(device).type == "cuda":
        return "bf16"
    return "bf16" if {"amx_bf16", "avx512_bf16"} & cpu_flags() else "fp32"


def autocast(precision: str, device):
    """bf16 autocast on the device when ``precision`` is bf16, else nothing."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
