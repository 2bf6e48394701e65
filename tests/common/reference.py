"""Pure-torch references and test data for every collective test, single-process
and multi-process, CPU and CUDA alike: `reference` (any order of summation: for
exact data, or where a tolerance applies), `in_rank_order` (ranks combined
0..n-1, what the CUDA IPC kernels compute bit for bit), `bitwise_fold` (the
bitwise ops and bool tensors, as gloo reduces them), and the data fed to
them (`exact_data`: small integers every order sums to the same bits;
`random_data`: floats whose bits depend on the order)."""
import torch
from torch.distributed import ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.uint8, torch.int32, torch.int64]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}

# Integer AVG as NCCL computes it: the sum wraps in the dtype, then is divided
# by the number of contributions (tensors or ranks), truncating toward zero.
# Per dtype: three inputs and the averages of the first two and of all three,
# worked out by hand (e.g. int8: 100 + 100 + 100 wraps to 44, 44 / 3 = 14;
# -5 / 3 = -1, not -2).
I32_MIN, I32_MAX, I64_MIN, I64_MAX = -2**31, 2**31 - 1, -2**63, 2**63 - 1
INT_AVG_CASES = {
    torch.int8: ([[100, -7, -128, 1], [100, 2, -128, 0], [100, 0, -128, 0]],
                 [-28, -2, 0, 0], [14, -1, -42, 0]),
    torch.uint8: ([[200, 3, 255], [100, 0, 255], [0, 0, 255]], [22, 1, 127], [14, 1, 84]),
    torch.int32: ([[I32_MAX, -3, I32_MIN], [1, 0, -1], [0, -1, 0]],
                  [-1073741824, -1, 1073741823], [-715827882, -1, 715827882]),
    torch.int64: ([[I64_MAX, -3, I64_MIN], [1, 0, -1], [0, -1, 0]],
                  [-4611686018427387904, -1, 4611686018427387903],
                  [-3074457345618258602, -1, 3074457345618258602]),
}


def make_inputs(n, numel, dtype, op, seed=0):
    """Integer-valued data small enough that every op is exact in every dtype:
    sums of 8 values stay < 2^7, products of 8 values in {-2..2} stay in int8
    range modulo wrap (the reference wraps the same way)."""
    g = torch.Generator().manual_seed(seed * 1000 + n * 37 + numel)
    lo, hi = (-2, 3) if op == ReduceOp.PRODUCT else (-8, 9)
    if dtype == torch.uint8:
        lo, hi = (0, 3) if op == ReduceOp.PRODUCT else (0, 16)
    return [torch.randint(lo, hi, (numel,), generator=g).to(dtype) for _ in range(n)]


def reference(tensors, op):
    """op over the list, computed the way fastpar promises: fp32 accumulation for
    16-bit floats, the dtype itself otherwise (integers wrap), AVG = sum / n
    (on integers NCCL's: the wrapped sum divided by n, truncated toward zero)."""
    dtype = tensors[0].dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if dtype in (torch.int8, torch.uint8, torch.int32):
        acc = torch.int64  # exact, then wrapped back to the dtype as fastpar's arithmetic does
    s = torch.stack([t.to(acc) for t in tensors])
    if op == ReduceOp.SUM:
        r = s.sum(0)
    elif op == ReduceOp.AVG and dtype in FLOATS:
        r = s.sum(0) / len(tensors)
    elif op == ReduceOp.AVG:
        return torch.div(reference(tensors, ReduceOp.SUM).to(torch.int64), len(tensors),
                         rounding_mode="trunc").to(dtype)
    elif op == ReduceOp.PRODUCT:
        r = s.prod(0)
    elif op == ReduceOp.MIN:
        r = s.amin(0)
    else:
        r = s.amax(0)
    if dtype in (torch.int8, torch.uint8, torch.int32):
        bits = {torch.int8: 8, torch.uint8: 8, torch.int32: 32}[dtype]
        r = r & ((1 << bits) - 1)
        if dtype != torch.uint8:
            r = torch.where(r >= (1 << (bits - 1)), r - (1 << bits), r)
    return r.to(dtype)


def bits(t):
    """A view whose equality is bitwise equality (NaN == NaN, -0 != +0)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def random_data(rank, n, dtype, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype in FLOATS:
        return torch.randn(n, generator=g, dtype=torch.float64).mul(4).to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def exact_data(rank, n, dtype, seed=0):
    """Small integers: every order of summation or multiplication gives the
    same bits (what NCCL, whose order is its own, can be held to)."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + seed) % 5
    if dtype != torch.uint8:
        v = v - 2
    return v.to(dtype)


def in_rank_order(xs, op, dtype):
    """The IPC kernels' result: ranks combined in order 0..n-1 in fp32 for
    16-bit floats (the dtype itself otherwise), AVG divided once, rounded once."""
    acc_t = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        x = x.to(acc_t)
        acc = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
               ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}[op](acc, x)
    if op == ReduceOp.AVG and dtype in FLOATS:
        acc = acc / len(xs)
    elif op == ReduceOp.AVG:  # NCCL's: the wrapped sum, divided truncating toward zero
        acc = torch.div(acc.to(torch.int64), len(xs), rounding_mode="trunc")
    return acc.to(dtype)


def bitwise_fold(op, dtype):
    """The pure-torch function that folds ranks' tensors for a bitwise op, or
    for any op on bool tensors, as gloo computes it: on bool SUM and MAX are
    an or, PRODUCT and MIN an and."""
    if dtype == torch.bool:
        op = {ReduceOp.SUM: ReduceOp.BOR, ReduceOp.MAX: ReduceOp.BOR,
              ReduceOp.PRODUCT: ReduceOp.BAND, ReduceOp.MIN: ReduceOp.BAND}.get(op, op)
    return {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or, ReduceOp.BXOR: torch.bitwise_xor}[op]
