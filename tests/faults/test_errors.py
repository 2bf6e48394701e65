"""Every user mistake gets one clear error, before any work, naming the argument,
the index and both values. These tests pin the messages (and that nothing was
written when the call was refused)."""
import re

import pytest
import torch
from torch.distributed import ReduceOp

import fastpar


def raises(exc, msg):
    return pytest.raises(exc, match=re.escape(msg))


def test_empty_list():
    with raises(ValueError, "fastpar.allreduce: expected a non-empty list of tensors for argument 'tensors', "
                            "got an empty list"):
        fastpar.allreduce([])
    with raises(ValueError, "fastpar.allgather: expected a non-empty list of tensors for argument 'inputs'"):
        fastpar.allgather([])


def test_not_a_list():
    with raises(TypeError, "fastpar.allreduce: tensors must be a list or tuple of tensors, got Tensor"):
        fastpar.allreduce(torch.ones(3))
    with raises(TypeError, "fastpar.reduce: inputs[1] must be a Tensor, got int"):
        fastpar.reduce([torch.ones(3), 3])


def test_dtype_mismatch_names_both():
    ts = [torch.ones(4), torch.ones(4, dtype=torch.float16)]
    with raises(TypeError, "fastpar.allreduce: tensors[1] has dtype torch.float16 but tensors[0] has dtype "
                           "torch.float32"):
        fastpar.allreduce(ts)
    assert ts[0].eq(1).all(), "nothing may be written when a call is refused"


def test_numel_mismatch_names_both():
    with raises(ValueError, "fastpar.allreduce: tensors[2] has 5 elements (shape [5]) but tensors[0] has 4 "
                            "elements (shape [2, 2])"):
        fastpar.allreduce([torch.ones(2, 2), torch.ones(4), torch.ones(5)])


def test_non_contiguous_input():
    t = torch.ones(4, 4).t()
    with raises(ValueError, "fastpar.allreduce: tensors[1] must be contiguous, but it has sizes [4, 4] and "
                            "strides [1, 4] (call .contiguous() first)"):
        fastpar.allreduce([torch.ones(4, 4), t])


def test_unsupported_dtype():
    with raises(TypeError, "fastpar.allreduce: tensors[0] has dtype torch.complex64, which fastpar does not "
                           "support"):
        fastpar.allreduce([torch.ones(3, dtype=torch.complex64)] * 2)


def test_unknown_op():
    with raises(ValueError, "fastpar.allreduce: op is ReduceOp.BAND, which fastpar does not support"):
        fastpar.allreduce([torch.ones(3)] * 2, ReduceOp.BAND)
    with raises(ValueError, "fastpar.reduce_scatter: op is 'XOR', which is not one of ReduceOp.SUM"):
        fastpar.reduce_scatter([torch.ones(4)] * 2, op="XOR")


def test_unknown_algorithm():
    with raises(ValueError, "fastpar.allreduce: algorithm is 'tree' but must be 'auto', 'direct' or 'ring'"):
        fastpar.allreduce([torch.ones(3)] * 2, algorithm="tree")


def test_root_out_of_range():
    with raises(ValueError, "fastpar.reduce: root is 2 but inputs has 2 tensors (valid: 0..1)"):
        fastpar.reduce([torch.ones(3), torch.ones(3)], root=2)
    with raises(ValueError, "fastpar.reduce: root is -1 but inputs has 2 tensors (valid: 0..1)"):
        fastpar.reduce([torch.ones(3), torch.ones(3)], root=-1)


def test_reduce_output_numel():
    with raises(ValueError, "fastpar.reduce: output has 4 elements but 3 were expected (the numel of inputs[0])"):
        fastpar.reduce([torch.ones(3)] * 2, output=torch.empty(4))


def test_chunk_sizes_out_of_range():
    x = torch.arange(10)
    with raises(ValueError, "fastpar.scatter: chunk_sizes sums to 12 but tensor.size(0) is 10"):
        fastpar.scatter(x, ["cpu", "cpu"], chunk_sizes=[6, 6])
    with raises(ValueError, "fastpar.scatter: chunk_sizes[1] is -1; chunk sizes must be non-negative ints"):
        fastpar.scatter(x, ["cpu", "cpu"], chunk_sizes=[11, -1])
    with raises(ValueError, "fastpar.scatter: chunk_sizes has 3 entries but devices has 2"):
        fastpar.scatter(x, ["cpu", "cpu"], chunk_sizes=[5, 5, 0])


def test_dim_out_of_range():
    with raises(IndexError, "fastpar.scatter: dim is 2 but tensor has 2 dimensions (valid: -2..1)"):
        fastpar.scatter(torch.ones(2, 2), ["cpu", "cpu"], dim=2)


def test_gather_shape_mismatch():
    with raises(ValueError, "fastpar.gather: tensors[1] has shape [2, 4] but tensors[0] has shape [2, 3]; "
                            "they may differ only in dim 0"):
        fastpar.gather([torch.ones(2, 3), torch.ones(2, 4)])


def test_devices_mixed_and_bad():
    with raises(ValueError, "fastpar.broadcast: devices[1] is 'cuda:0' but devices[0] is 'cpu'; all devices "
                            "must be CPU or all CUDA"):
        fastpar.broadcast(torch.ones(2), ["cpu", "cuda:0"])
    with raises(ValueError, "fastpar.broadcast: exactly one of 'devices' and 'out' must be given"):
        fastpar.broadcast(torch.ones(2))


def test_reduce_scatter_indivisible():
    with raises(ValueError, "fastpar.reduce_scatter: inputs[0] has 10 elements, which is not divisible by "
                            "len(inputs) = 3"):
        fastpar.reduce_scatter([torch.ones(10)] * 3)


def test_allgather_wrong_output_size():
    with raises(ValueError, "fastpar.allgather: outputs[0] has 5 elements but 6 were expected "
                            "(len(inputs) * inputs[0].numel())"):
        fastpar.allgather([torch.ones(3)] * 2, [torch.empty(5), torch.empty(5)])


def test_coalesced_shape_mismatch():
    with raises(ValueError, "fastpar.allreduce_coalesced: tensors[1][0] has shape [3] and dtype torch.float32 "
                            "but tensors[0][0] has shape [2] and dtype torch.float32"):
        fastpar.allreduce_coalesced([[torch.ones(2)], [torch.ones(3)]])


def test_torch_ops_check_too():
    # The C++ ops are public (torch.ops.fastpar.*): they check with the same words.
    with raises(ValueError, "fastpar.allreduce: tensors[1] has 2 elements (shape [2]) but tensors[0] has 3"):
        torch.ops.fastpar.allreduce_([torch.ones(3), torch.ones(2)], 0, "auto")
    with raises(ValueError, "fastpar.allreduce: op has value 9, which is not one of ReduceOp.SUM (0)"):
        torch.ops.fastpar.allreduce_([torch.ones(3)], 9, "auto")
