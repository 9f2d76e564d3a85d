#!/usr/bin/env python3
"""The torch peers of dcp_bench, run on the GPU machine (not in CI).

Reads dcp_bench CSVs (--routes: the attention phase of each route, and the whole dense route;
--kernels: the dense_mha[_native|_cudnn] and sparse_mqa kernels alone) and times the same shapes
through torch:

  dense MHA   (bottom-right causal, qk 192 / v 128 or, --dims glm5, 256 / 256, bf16):
              sdpa_cudnn  torch SDPA restricted to the cuDNN backend
              sdpa_flash  torch SDPA restricted to FlashAttention, v zero-padded to 192 (the
                          padding is done once, outside the timing; the output is sliced)
  dense route (routes CSV, op dense_route: our whole layer time auto_us on the dense route):
              torch_route  the route as torch composes it: the K and V up-projection GEMMs of
                           every key's latent row (kv_c @ w_uk^T, kv_c @ w_uv, cuBLAS), k_pe
                           broadcast to the heads and concatenated, q = [q_nope | q_rope], and
                           cuDNN SDPA (bottom-right causal) writing bf16 out
  sparse MQA  (576-wide latent queries over the top-k selected rows, v = first 512 columns):
              torch_gather_bmm  index the rows, bmm, masked softmax, bmm (in token chunks that
                                bound the gathered copy to ~1 GiB)

The selected rows follow dcp_bench's deterministic stand-in for the indexer (every causal
position while position < K, else the token itself and K-1 positions spread evenly before
it), so both sides do the same work. Writes one CSV: per (source, op, shape, peer) our time,
the peer's time, both TFLOP/s and speedup_vs_peer = peer_us / ours_us (> 1: we are faster).

  python3 scripts/peer_torch.py --routes out/routes.csv --kernels out/kernels.csv \\
      --out out/peers.csv
"""

import argparse
import csv
import math
import os
import statistics
import sys

DENSE_PEERS = ("sdpa_cudnn", "sdpa_flash")
DENSE_KERNELS = ("dense_mha", "dense_mha_native", "dense_mha_cudnn")
# Per-head sizes of the models (--dims): qk, v, latent width, kv_lora_rank, qk_nope.
DIMS = {"deepseek_v32": (192, 128, 576, 512, 128), "glm5": (256, 256, 576, 512, 192)}
SPARSE_PEERS = ("torch_gather_bmm",)
OUT_COLUMNS = [
    "source", "op", "batch", "num_seqs", "query_len", "seq_len", "heads", "topk", "flops",
    "ours_us", "ours_tflops", "peer", "peer_us", "peer_tflops", "speedup_vs_peer", "status",
]


def fail(message):
    print(f"peer_torch.py: {message}", file=sys.stderr)
    sys.exit(2)


def read_csv(path):
    if not os.path.isfile(path):
        fail(f"no such file: {path}")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        fail(f"{path} has no rows")
    return rows


def selected_keys(num_seqs, query_len, seq_len, topk):
    """Keys attended, summed over the query tokens (each capped at topk)."""
    context = seq_len - query_len
    total = 0
    for i in range(query_len):
        total += min(context + i + 1, topk)
    return num_seqs * total


def shapes_from_csvs(routes_path, kernels_path, dims):
    """(source, op, batch, b, q, s, heads, topk, ours_us) for every uniform batch measured."""
    shapes = []
    if routes_path:
        for row in read_csv(routes_path):
            if row.get("status") != "ok" or row.get("uniform") != "1":
                continue
            if row.get("dims") != dims:
                continue
            common = (row["batch"], int(row["num_seqs"]), int(row["query_len"]),
                      int(row["seq_len"]), int(row["heads"]), int(row["topk"]))
            if row.get("route_auto") == "dense_mha" and row.get("auto_attn_us"):
                shapes.append(("routes", "dense_mha") + common + (float(row["auto_attn_us"]),))
            if row.get("route_auto") == "dense_mha" and row.get("auto_us"):
                shapes.append(("routes", "dense_route") + common + (float(row["auto_us"]),))
            if row.get("mqa_attn_us"):
                shapes.append(("routes", "sparse_mqa") + common + (float(row["mqa_attn_us"]),))
    if kernels_path:
        for row in read_csv(kernels_path):
            if row.get("kernel") not in DENSE_KERNELS + ("sparse_mqa",):
                continue
            if row.get("status") != "ok" or row.get("uniform") != "1" or row.get("dims") != dims:
                continue
            shapes.append(("kernels", row["kernel"], row["batch"], int(row["num_seqs"]),
                           int(row["query_len"]), int(row["seq_len"]), int(row["heads"]),
                           int(row["topk"]), float(row["time_us"])))
    return shapes


class Peers:
    """Times the torch peers; results cached per (peer, shape)."""

    def __init__(self, torch, warmup, iters, qk, v, latent, rank, nope):
        self.torch = torch
        self.warmup, self.iters = warmup, iters
        self.qk, self.v, self.latent, self.rank, self.nope = qk, v, latent, rank, nope
        self.cache = {}
        self.device = torch.device("cuda")

    def time_us(self, fn):
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    def dense(self, peer, b, q, s, h):
        key = (peer, b, q, s, h)
        if key not in self.cache:
            self.cache[key] = self._dense(peer, b, q, s, h)
        return self.cache[key]

    def _dense(self, peer, b, q, s, h):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        gen = torch.Generator(device=self.device).manual_seed(1)
        bf16 = torch.bfloat16
        query = torch.randn(b, h, q, self.qk, device=self.device, dtype=bf16, generator=gen)
        key = torch.randn(b, h, s, self.qk, device=self.device, dtype=bf16, generator=gen)
        value = torch.randn(b, h, s, self.v, device=self.device, dtype=bf16, generator=gen)
        backend = SDPBackend.CUDNN_ATTENTION
        if peer == "sdpa_flash":
            backend = SDPBackend.FLASH_ATTENTION
            value = F.pad(value, (0, self.qk - self.v))
        scale = 1.0 / math.sqrt(self.qk)
        if q == s:
            mask_kwargs = {"is_causal": True}
        elif peer == "sdpa_cudnn":
            # New tokens after their context: query i sees keys [0, s - q + i]. An explicit
            # mask keeps SDPA on cuDNN (a CausalBias would dispatch to another backend).
            rows = torch.arange(q, device=self.device)[:, None]
            cols = torch.arange(s, device=self.device)[None, :]
            mask_kwargs = {"attn_mask": cols <= rows + (s - q)}
        else:
            # FlashAttention's causal mask is bottom-right aligned: CausalBias dispatches to it.
            from torch.nn.attention.bias import causal_lower_right
            mask_kwargs = {"attn_mask": causal_lower_right(q, s)}

        def run():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(query, key, value, scale=scale,
                                                     **mask_kwargs)
            return out[..., :self.v]

        try:
            run()
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - an unsupported backend/shape is a result
            return None, f"unsupported: {str(error).splitlines()[0][:120]}"
        return self.time_us(run), "ok"

    def route(self, b, q, s, h):
        key = ("torch_route", b, q, s, h)
        if key not in self.cache:
            self.cache[key] = self._route(b, q, s, h)
        return self.cache[key]

    def _route(self, b, q, s, h):
        """The dense route as torch composes it, from latent rows to the attention output."""
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        gen = torch.Generator(device=self.device).manual_seed(3)
        bf16 = torch.bfloat16
        rope = self.qk - self.nope
        dev = self.device
        kv_c = torch.randn(b * s, self.rank, device=dev, dtype=bf16, generator=gen)
        k_pe = torch.randn(b * s, rope, device=dev, dtype=bf16, generator=gen)
        q_nope = torch.randn(b * q, h, self.nope, device=dev, dtype=bf16, generator=gen)
        q_rope = torch.randn(b * q, h, rope, device=dev, dtype=bf16, generator=gen)
        scale = 1.0 / math.sqrt(self.rank)
        w_uk = torch.randn(h * self.nope, self.rank, device=dev, dtype=bf16, generator=gen) * scale
        w_uv = torch.randn(self.rank, h * self.v, device=dev, dtype=bf16, generator=gen) * scale
        sm_scale = 1.0 / math.sqrt(self.qk)
        if q == s:
            mask_kwargs = {"is_causal": True}
        else:
            rows = torch.arange(q, device=dev)[:, None]
            cols = torch.arange(s, device=dev)[None, :]
            mask_kwargs = {"attn_mask": cols <= rows + (s - q)}

        def run():
            k_nope = (kv_c @ w_uk.t()).view(b * s, h, self.nope)
            v = (kv_c @ w_uv).view(b, s, h, self.v)
            k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, h, -1)], dim=-1).view(
                b, s, h, self.qk)
            query = torch.cat([q_nope, q_rope], dim=-1).view(b, q, h, self.qk)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(
                    query.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    scale=sm_scale, **mask_kwargs)
            return out.transpose(1, 2)

        try:
            run()
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - an unsupported shape is a result
            return None, f"unsupported: {str(error).splitlines()[0][:120]}"
        return self.time_us(run), "ok"

    def sparse(self, b, q, s, h, topk):
        key = ("torch_gather_bmm", b, q, s, h, topk)
        if key not in self.cache:
            self.cache[key] = self._sparse(b, q, s, h, topk)
        return self.cache[key]

    def _sparse(self, b, q, s, h, topk):
        torch = self.torch
        bf16 = torch.bfloat16
        gen = torch.Generator(device=self.device).manual_seed(2)
        tokens = b * q
        queries = torch.randn(tokens, h, self.latent, device=self.device, dtype=bf16,
                              generator=gen)
        cache = torch.randn(b * s, self.latent, device=self.device, dtype=bf16, generator=gen)
        # Top-k rows of every token, as dcp_bench builds them (FillTopkRow).
        position = (torch.arange(q, device=self.device) + (s - q)).repeat(b)[:, None]
        offset = (torch.arange(b, device=self.device) * s).repeat_interleave(q)[:, None]
        j = torch.arange(topk, device=self.device)[None, :]
        causal = torch.where(j <= position, j, -1)
        spread = torch.where(j < topk - 1, (j * position) // max(topk - 1, 1), position)
        indices = torch.where(position < topk, causal, spread)
        indices = torch.where(indices >= 0, indices + offset, indices).to(torch.int32)
        scale = 1.0 / math.sqrt(self.qk)
        chunk = max(1, min(tokens, (1 << 30) // (topk * self.latent * 2)))

        def run():
            outs = []
            for begin in range(0, tokens, chunk):
                idx = indices[begin:begin + chunk].long()
                valid = idx >= 0
                rows = cache[idx.clamp(min=0)]                     # [C, K, 576]
                scores = torch.bmm(queries[begin:begin + chunk], rows.transpose(1, 2))
                scores = scores.float().mul_(scale)
                scores.masked_fill_(~valid[:, None, :], float("-inf"))
                probs = torch.softmax(scores, dim=-1).to(bf16)       # [C, H, K]
                outs.append(torch.bmm(probs, rows[..., :self.rank]))  # [C, H, 512]
            return outs

        try:
            run()
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - out of memory is a result here
            return None, f"error: {str(error).splitlines()[0][:120]}"
        return self.time_us(run), "ok"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routes", help="dcp_bench --mode routes CSV")
    parser.add_argument("--kernels", help="dcp_bench --mode kernels CSV")
    parser.add_argument("--dense-peers", default=",".join(DENSE_PEERS),
                        help="dense MHA peers to time, comma-separated (default: all of "
                             f"{','.join(DENSE_PEERS)})")
    parser.add_argument("--out", help="output CSV (default: peers.csv next to the first input)")
    parser.add_argument("--dims", default="deepseek_v32", choices=sorted(DIMS),
                        help="only rows of these dims, and the peers at their sizes (default "
                             "deepseek_v32: qk 192 / v 128 / latent 576; glm5: qk 256 / v 256)")
    parser.add_argument("-w", "--warmup", type=int, default=2, help="warm-up runs (default 2)")
    parser.add_argument("-n", "--iters", type=int, default=10, help="timed runs (default 10)")
    parser.add_argument("--heads", default="",
                        help="only these per-rank head counts, e.g. 128 or 16,128 (default all)")
    parser.add_argument("--max-tokens", type=int, default=32768,
                        help="skip shapes with more query tokens (default 32768)")
    args = parser.parse_args()
    if not args.routes and not args.kernels:
        parser.error("give --routes and/or --kernels (dcp_bench CSVs)")
    for path in (args.routes, args.kernels):
        if path and not os.path.isfile(path):
            fail(f"no such file: {path}")
    out_path = args.out or os.path.join(
        os.path.dirname(os.path.abspath(args.routes or args.kernels)), "peers.csv")

    shapes = shapes_from_csvs(args.routes, args.kernels, args.dims)
    if args.heads:
        try:
            wanted = {int(h) for h in args.heads.split(",") if h}
        except ValueError:
            fail(f"--heads: '{args.heads}' is not a list of integers")
        shapes = [shape for shape in shapes if shape[6] in wanted]
    if not shapes:
        fail(f"no measured uniform batch of dims '{args.dims}' in the input CSVs")
    try:
        import torch
    except ImportError:
        fail("torch is not installed (pip install torch; the peers need a CUDA GPU)")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")
    qk, v, latent, rank, nope = DIMS[args.dims]
    dense_peers = [peer for peer in args.dense_peers.split(",") if peer]
    if not dense_peers or any(peer not in DENSE_PEERS for peer in dense_peers):
        fail(f"--dense-peers: '{args.dense_peers}' must name some of {','.join(DENSE_PEERS)}")
    peers = Peers(torch, args.warmup, args.iters, qk=qk, v=v, latent=latent, rank=rank,
                  nope=nope)
    print(f"# peer_torch: torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"{len(shapes)} shapes", flush=True)

    results = []
    for source, op, batch, b, q, s, h, topk, ours_us in shapes:
        if b * q > args.max_tokens:
            continue
        if op in DENSE_KERNELS:
            flops = 2.0 * h * (qk + v) * selected_keys(b, q, s, 1 << 62)
            runs = [(peer, peers.dense(peer, b, q, s, h)) for peer in dense_peers]
        elif op == "dense_route":
            flops = (2.0 * h * (qk + v) * selected_keys(b, q, s, 1 << 62)
                     + 2.0 * b * s * rank * h * (nope + v))
            runs = [("torch_route", peers.route(b, q, s, h))]
        else:
            flops = 2.0 * h * (latent + rank) * selected_keys(b, q, s, topk)
            runs = [("torch_gather_bmm", peers.sparse(b, q, s, h, topk))]
        for peer, (peer_us, status) in runs:
            row = {
                "source": source, "op": op, "batch": batch, "num_seqs": b, "query_len": q,
                "seq_len": s, "heads": h, "topk": topk, "flops": f"{flops:.6g}",
                "ours_us": f"{ours_us:.6g}", "ours_tflops": f"{flops / ours_us * 1e-6:.4g}",
                "peer": peer, "peer_us": "", "peer_tflops": "", "speedup_vs_peer": "",
                "status": status,
            }
            if peer_us:
                row["peer_us"] = f"{peer_us:.6g}"
                row["peer_tflops"] = f"{flops / peer_us * 1e-6:.4g}"
                row["speedup_vs_peer"] = f"{peer_us / ours_us:.3f}"
            results.append(row)
            print(f"{source:8s} {op:10s} {batch:>10s} h{h:<4d} ours {ours_us:10.1f} us  "
                  f"{peer:16s} {row['peer_us'] or '-':>10s} us  x{row['speedup_vs_peer'] or '-'}"
                  f"  {status}", flush=True)
        torch.cuda.empty_cache()

    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=OUT_COLUMNS)
        writer.writeheader()
        writer.writerows(results)
    print(f"# wrote {out_path} ({len(results)} rows)")


if __name__ == "__main__":
    main()
