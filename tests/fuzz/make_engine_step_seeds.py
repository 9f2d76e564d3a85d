#!/usr/bin/env python3
"""Writes the seed corpus of engine_step_fuzz.cc: byte strings that decode, read for read as the
target reads them, into well-formed steps (so the fuzzer starts from steps that plan and run
on both routes, not from refusals). Run from the repository root; rewrites
tests/fuzz/corpus/engine_step/."""
import os
import struct

OUT = "tests/fuzz/corpus/engine_step"


class Writer:
    def __init__(self):
        self.data = b""

    def u32(self, value):
        self.data += struct.pack(">I", value & 0xFFFFFFFF)

    def int(self, lo, value):  # Bytes::Int(lo, hi) returning value
        self.u32(value - lo)

    def near(self, lo, value):  # Bytes::Near(lo, hi) returning value (in range)
        self.u32(1)
        self.int(lo, value)


def step(block_exp, threshold, topk, requests, causal=False, force_mqa=False):
    """requests: (seq_len, query_len). causal: top-k width 0 (every causal key, seq_len <= K);
    else width K with rows of causal keys."""
    w = Writer()
    block = 1 << block_exp
    w.int(0, block_exp)
    w.int(1, threshold)
    w.int(1, topk)
    w.int(0, 0 if force_mqa else 1)
    w.int(0, 1)  # workspace: the formula's
    w.int(0, len(requests))
    for i, (seq, query) in enumerate(requests):
        w.near(1, seq)
        if query == 1:
            w.u32(1)
        else:
            w.u32(0)
            w.near(1, query)
        w.near(0, i + 1)  # request id
    w.int(0, 1)  # the scheduler's block size
    stride = max((seq + block - 1) // block for seq, _ in requests)
    w.int(0, stride)
    w.near(1, stride * len(requests) + 2)  # blocks
    for _ in range(stride * len(requests)):
        w.u32(1)  # id i % num_blocks: distinct
    w.int(0, 1)  # no slot mapping
    if causal:
        w.int(0, 0)  # the top-k width from the bytes ...
        w.int(-2, 0)  # ... 0: every causal key
        return w.data
    w.int(0, 1)  # the configured top-k width
    for seq, query in requests:
        for q in range(query):
            position = seq - query + q
            for c in range(topk):
                w.u32(1)
                w.int(-1, c if c <= position else -1)
    return w.data


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    seeds = {
        "mixed": step(4, 1, 64, [(40, 40), (20, 1), (64, 8)]),
        "decodes": step(2, 1, 16, [(30, 1), (5, 1), (17, 1)]),
        "long_prefill": step(3, 2, 16, [(50, 50), (9, 2)]),
        "forced_mqa": step(4, 1, 32, [(24, 24), (12, 1)], force_mqa=True),
        "causal_prefills": step(4, 1, 64, [(33, 33), (60, 12), (7, 1)], causal=True),
        "causal_one_token": step(0, 1, 8, [(1, 1)], causal=True),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
