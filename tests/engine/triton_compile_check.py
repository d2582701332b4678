"""Compile every Triton kernel of the engine for a GPU architecture, ahead of time, with no GPU:
Triton's compiler down to a cubin with the ptxas its wheel bundles. Run by
test_triton_compile.py in a process of its own: Triton's interpreter, which the other kernel tests
turn on (TRITON_INTERPRET=1), swaps the language's semantics process-wide, and a kernel does not
compile in a process that has it on.

    python tests/engine/triton_compile_check.py 90 bf16 [90 fp32 80 bf16 ...]

Prints one line a kernel: its name, the architecture, the dtype and its shared memory in bytes.
"""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from splitserve.engine import triton_attention, triton_fused  # noqa: E402


def source(kernel, pointers: dict[str, str], constexprs: dict, floats: tuple[str, ...] = ()) -> ASTSource:
    """The kernel as Triton's launcher would hand it to the compiler: pointers typed, the other
    runtime arguments 32-bit ints or float32 scalars, constexprs given."""
    assert isinstance(kernel, JITFunction), "TRITON_INTERPRET is on: nothing compiles in this process"
    sig = {a: "constexpr" if a in constexprs else pointers.get(a, "fp32" if a in floats else "i32")
           for a in kernel.arg_names}
    return ASTSource(fn=kernel, signature=sig, constexprs=constexprs)


def kernels(dt: str) -> dict[str, ASTSource]:
    """Each kernel at llama3-8b's shapes (128-dim heads, 4 query heads a KV head, blocks of 16)."""
    p, low = "*" + dt, dt != "fp32"
    a, f = triton_attention, triton_fused
    return {
        "decode": source(a._split_kernel, dict(Q=p, K=p, V=p, T="*i64", L="*i64", OP="*fp32", MLP="*fp32"),
                         dict(BS=16, GROUP=4, ROWS=16, HD=128, BLOCK_D=128, BLOCK=a.BLOCK_N, HAS_WINDOW=True,
                              LOW=low, EMULATE=False), ("scale",)),
        "reduce": source(a._reduce_kernel, dict(OP="*fp32", MLP="*fp32", O=p),
                         dict(HD=128, BLOCK_D=128, BLOCK_S=64, EMULATE=False)),
        "prefill": source(a._prefill_kernel, dict(Q=p, K=p, V=p, O=p, TILES="*i32", SEGS="*i32", T="*i64"),
                          dict(BS=16, GROUP=4, HD=128, BLOCK_D=128, BLOCK_M=a.PREFILL_ROWS, BLOCK=a.BLOCK_N,
                               HAS_WINDOW=True, LOW=low, EMULATE=False), ("scale",)),
        "rms_norm": source(f._rms_norm_kernel, dict(X=p, R=p, W=p, Y=p, RO=p),
                           dict(HAS_RESIDUAL=True, BLOCK=4096, EMULATE=False), ("eps",)),
        "rotary": source(f._rotary_kernel, dict(QKV=p, P="*i64", COS="*fp32", SIN="*fp32"),
                         dict(HALF=64, BLOCK=64, EMULATE=False)),
        "silu_mul": source(f._silu_mul_kernel, dict(GU=p, O=p), dict(BLOCK=f.SILU_BLOCK, EMULATE=False)),
        "write_kv": source(f._write_kv_kernel, dict(K=p, V=p, KC=p, VC=p, S="*i64"), dict(BLOCK=1024)),
    }


def main(argv: list[str]) -> int:
    for arch, dt in zip(argv[::2], argv[1::2]):
        for name, src in kernels(dt).items():
            k = triton_compile(src, target=GPUTarget("cuda", int(arch), 32))
            print(name, arch, dt, k.metadata.shared if k.asm.get("cubin") else "no-cubin", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
