"""The fused Mogrifier kernels (mogrifier/fused.py) compiled by Triton for an H100/H200 (sm_90) and an A100 (sm_80)
on a machine without a GPU, as a layer launches them: a layer at a shipped arch's widths (and at the widest rank
the config accepts) runs its window forward and backward on the CPU with every kernel launch recorded instead of
run, and each recorded launch is bound and compiled as Triton's launcher would compile it on that GPU (the same
constexpr values, argument types and specialisations), with the layer's block sizes chosen for that GPU's shared
memory. What only the compiler shows: the shared memory a kernel needs (above the device's, its first launch
raises OutOfResources), the tensor-core instructions of 16-bit products (the interpreter never runs that branch)
and the compiler's type checks. In a child process: Triton fixes at import whether the kernels are compiled or
interpreted, and the other tests import them interpreted."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# KB of shared memory a block may opt in to: an H100/H200 (sm_90), an A100 (sm_80)
LIMIT_KB = {90: 227, 80: 163}
# the shipped Mogrifier archs (models/mogrifier_lstm_lm.py): embedding width e, hidden size n, rounds, rank
ARCHS = {"ptb": (912, 912, 5, 84), "wt2": (272, 1366, 6, 48)}
# tensor-core products of 16-bit operands with float32 sums: wgmma (sm_90) or mma.sync (sm_80 and up)
TENSOR_CORE_MMA = re.compile(r"\b(?:wgmma\.mma_async|mma\.sync\.aligned)\.\S*\.f32\.(?:bf16|f16)\.(?:bf16|f16)\b")
B, T = 64, 2  # lamb's batch; two steps, so that the cell kernels run with and without a next step


def layer_cases(arch: str, worst: bool, layers=(1, 2)):
    """``(m, n, rounds, rank)`` of the arch's layers (the first reads e wide embeddings, the second the first's
    output); ``worst``: the widest rank the config accepts, min(e, n) - 1."""
    e, n, rounds, rank = ARCHS[arch]
    rank = min(e, n) - 1 if worst else rank
    widths = {1: e, 2: n}
    return sorted({(widths[i], n, rounds, rank) for i in layers})


def compile_layer(arch_target: int, dtype_name: str, m: int, n: int, rounds: int, rank: int, done: set):
    """Child side: every kernel that one layer's window launches, compiled for ``sm_<arch_target>`` unless in
    ``done`` (the launches compiled before), as a list of dicts (its name, constexprs, shared memory, the estimate
    fused.py chose its block by, whether its PTX multiplies on the tensor cores, whether a cubin came out)."""
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from define_fairseq.modules.mogrifier import fused as mf
    from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer

    launches = []

    class Recorder:  # kernel[grid](*args, **kwargs) recorded, not run
        def __init__(self, kernel):
            self.recorded = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.recorded, args, kwargs))

    names = ("_round_forward_kernel", "_round_backward_kernel", "_cell_forward_kernel", "_cell_backward_kernel")
    for name in names:  # (a kernel recorded for an earlier case: the kernel itself)
        setattr(mf, name, Recorder(getattr(getattr(mf, name), "recorded", getattr(mf, name))))
    mf.check_inputs = lambda x: None  # CPU tensors, though the kernels are compiled
    mf.shared_memory_limit = lambda device: LIMIT_KB[arch_target] << 10  # the blocks chosen for that GPU
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    layer = MogrifierLSTMLayer(m, n, rounds=rounds, rank=rank).to(dtype)
    layer.kernels = "triton"
    x = torch.randn(T, B, m, dtype=dtype, requires_grad=True)
    h0, c0 = (torch.zeros(B, n, dtype=dtype, requires_grad=True) for _ in range(2))
    y, (_, c) = layer(x, h0, c0, torch.ones(B, n, dtype=dtype))
    torch.autograd.backward([y, c], [torch.ones_like(y), torch.ones_like(c)])

    target = GPUTarget("cuda", arch_target, 32)
    backend = make_backend(target)
    estimate = getattr(mf, "round_shared_memory", None)  # (None in a fused.py that does not estimate)
    results = []
    for kernel, args, kwargs in launches:  # bound as JITFunction.run binds a launch (Triton 3.6)
        kwargs = dict(kwargs, debug=kernel.debug or knobs.runtime.debug)
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
        key = repr((arch_target, kernel.fn.__name__, signature, sorted(constexprs.items()), sorted(attrs.items())))
        if key in done:
            continue
        done.add(key)
        source = ASTSource(kernel, signature, constexprs, attrs)
        compiled = triton.compile(source, target=target, options=options.__dict__)
        constants = {kernel.arg_names[path[0]]: value for path, value in constexprs.items()}
        backward, low_rank = "backward" in kernel.fn.__name__, constants.get("LOW_RANK", False)
        size = torch.finfo(dtype).bits // 8
        results.append(
            dict(
                kernel=kernel.fn.__name__,
                constants={k: v for k, v in constants.items() if k in ("IN", "OUT", "K", "BK", "F32")},
                shared=compiled.metadata.shared,
                estimate=estimate(backward, size, constants["BK"]) if low_rank and estimate else None,
                tensor_cores=bool(TENSOR_CORE_MMA.search(compiled.asm["ptx"])),
                any_mma="mma" in compiled.asm["ptx"],
                cubin=bool(compiled.asm["cubin"]),
            )
        )
    return results


def compile_in_child(tmp_path, cases):
    """``compile_layer(*case)`` for every case in one child process, without the interpreter, from a fresh cache:
    ``[(case, results)]``."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    command = [sys.executable, os.path.abspath(__file__), json.dumps(cases)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def check(case, results, shipped_rank: bool):
    """Each kernel fits the target's shared memory, a low-rank round kernel within the estimate fused.py chose its
    block by; a round kernel multiplies 16-bit operands on the tensor cores with float32 sums, float32 ones never
    there (IEEE float32 products); a shipped rank in one chunk (the kernels as they were)."""
    target, dtype, m, n, rounds, rank = case
    where = f"sm_{target} {dtype} m={m} n={n} rounds={rounds} --mogrifier-rank={rank}"
    for r in results:
        what = f"{where}: {r['kernel']} {r['constants']} needs {r['shared']} bytes of shared memory"
        assert r["cubin"], what
        assert r["shared"] <= LIMIT_KB[target] << 10, f"{what}, above the {LIMIT_KB[target]} KB of the GPU"
        if not r["kernel"].startswith("_round"):
            continue
        assert r["estimate"] is not None and r["shared"] <= r["estimate"], f"{what}: estimated {r['estimate']}"
        assert r["constants"]["K"] == rank, what
        if dtype == "float32":
            assert r["constants"]["F32"] and not r["any_mma"], f"{what}: float32 products off the FMA units"
        else:
            assert not r["constants"]["F32"] and r["tensor_cores"], f"{what}: no tensor-core MMA with f32 sums"
        if shipped_rank:
            assert r["constants"]["BK"] >= rank, f"{what}: the shipped rank in chunks"


def check_all(tmp_path, cases, shipped):
    """``check`` of every case compiled in one child process; each of the four kernels compiled at least once."""
    compiled = compile_in_child(tmp_path, cases)
    for (case, results), shipped_rank in zip(compiled, shipped):
        check(case, results, shipped_rank)
    kinds = {r["kernel"] for _, results in compiled for r in results}
    assert kinds == {"_round_forward_kernel", "_round_backward_kernel", "_cell_forward_kernel", "_cell_backward_kernel"}


SHIPPED_RANKS = {rank for *_, rank in ARCHS.values()}
# float16 at the shipped ranks only: at the widest its operands take bfloat16's bytes, so the same blocks and shared
# memory, which the bfloat16 cases check; its own tensor-core products are checked at the shipped ranks
EVERY = [
    [target, dtype, *case]
    for target in LIMIT_KB
    for dtype in ("float32", "bfloat16", "float16")
    for arch in ARCHS
    for worst in ((False,) if dtype == "float16" else (False, True))
    for case in layer_cases(arch, worst)
]


# minutes of compiling: make test-slow (CI). Among the cases, the two that fail where a kernel's blocks ignore the
# device: the WikiText-2 arch's first layer at the widest rank in float32 for sm_80 (above rank 256 no float32 round
# kernel could launch) and the PTB arch's at the widest in bfloat16 for sm_90 (above 512 no 16-bit forward could).
@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(LIMIT_KB), ids=lambda t: f"sm{t}")  # one child each: two workers share it
def test_every_shipped_arch_fits_sm90_and_sm80(tmp_path, target):
    """Every shipped arch's layers with their rounds, at their rank and at the widest the config accepts, in
    float32, bfloat16 and float16, for sm_90 and sm_80 (minutes)."""
    cases = [case for case in EVERY if case[0] == target]
    check_all(tmp_path, cases, [case[-1] in SHIPPED_RANKS for case in cases])


if __name__ == "__main__":  # the child: compile the cases of argv[1] (JSON), print the results as JSON
    import time

    done, results = set(), []
    for case in json.loads(sys.argv[1]):
        start = time.perf_counter()
        results.append((case, compile_layer(*case, done)))
        print(f"{case}: {len(results[-1][1])} kernels in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(json.dumps(results))
