"""fastpar.DataParallel against single-device training on the whole batch."""
import copy
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastpar


def small_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 5))


def batches(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, 3, 8, 8, generator=g), torch.randint(0, 5, (b,), generator=g)) for b in sizes]


def assert_close_params(a: nn.Module, b: nn.Module, tol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("n_devices", [2, 3, 4])
def test_sgd_momentum_matches_single_device_with_uneven_and_tiny_batches(n_devices):
    ref = small_cnn()
    dp = fastpar.DataParallel(copy.deepcopy(ref), device_ids=["cpu"] * n_devices)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_dp = torch.optim.SGD(dp.parameters(), lr=0.1, momentum=0.9)
    # 13: uneven split; 2 and 1: fewer samples than devices; 12: even
    for x, y in batches([13, 2, 12, 1, 7]):
        for model, opt in ((ref, opt_ref), (dp, opt_dp)):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert_close_params(dp.module, ref)
    with torch.no_grad():  # a forward refreshes the replicas from the master
        dp(torch.randn(n_devices, 3, 8, 8))
    for r, replica in enumerate(dp.replicas()):
        for p, q in zip(dp.module.parameters(), replica.parameters()):
            assert torch.equal(p, q), f"replica {r} differs from the master"


def test_a_dropped_wrapper_and_its_replicas_are_freed():
    # The replicas' gradient hooks must not keep the wrapper alive (they would
    # hold every replica's parameters and gradient buffers until exit).
    dp = fastpar.DataParallel(small_cnn(), device_ids=["cpu"] * 3)
    x, y = batches([6])[0]
    F.cross_entropy(dp(x), y).backward()
    replicas = [weakref.ref(r) for r in dp.replicas()[1:]]
    wrapper = weakref.ref(dp)
    assert replicas and all(r() is not None for r in replicas)
    del dp
    gc.collect()
    assert wrapper() is None
    assert all(r() is None for r in replicas)


def test_split_is_balanced_and_never_exceeds_the_batch():
    from fastpar._nested import balanced_chunk_sizes
    assert balanced_chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert balanced_chunk_sizes(2, 4) == [1, 1]
    assert balanced_chunk_sizes(0, 4) == [0]


def test_outputs_equal_single_device_in_eval_and_no_grad():
    ref = small_cnn()
    dp = fastpar.DataParallel(copy.deepcopy(ref), device_ids=["cpu", "cpu", "cpu"]).eval()
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(dp(x), ref.eval()(x))


class NestedIO(nn.Module):
    """Takes a tuple, a dict and a keyword tensor; returns a dict holding a tuple and a loss."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, pair, extra, *, scale, tag="t"):
        a, b = pair
        h = self.lin(a + b) * extra["w"] * scale
        return {"h": h, "parts": (h.sum(1), [h[:, :1]]), "loss": h.pow(2).mean(), "tag": tag}


def test_nested_inputs_kwargs_outputs_and_weighted_scalar_loss():
    torch.manual_seed(0)
    ref = NestedIO()
    dp = fastpar.DataParallel(copy.deepcopy(ref), device_ids=["cpu"] * 3)
    a, b, w = torch.randn(7, 4), torch.randn(7, 4), torch.randn(7, 1)
    scale = torch.tensor(0.5)  # 0-dim: copied to each replica, not split
    out_dp = dp((a, b), {"w": w}, scale=scale, tag="x")
    out_ref = ref((a, b), {"w": w}, scale=scale, tag="x")
    torch.testing.assert_close(out_dp["h"], out_ref["h"])
    torch.testing.assert_close(out_dp["parts"][0], out_ref["parts"][0])
    torch.testing.assert_close(out_dp["parts"][1][0], out_ref["parts"][1][0])
    assert out_dp["tag"] == ["x", "x", "x"]  # non-tensor outputs: one per replica
    # 7 samples on 3 replicas (3, 2, 2): the weighted mean is the loss of the whole batch
    torch.testing.assert_close(out_dp["loss"], out_ref["loss"])
    out_dp["loss"].backward()
    out_ref["loss"].backward()
    for p, q in zip(dp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_scalar_gather_stack_keeps_nn_data_parallel_behaviour():
    torch.manual_seed(0)
    dp = fastpar.DataParallel(NestedIO(), device_ids=["cpu"] * 2, scalar_gather="stack")
    out = dp((torch.randn(4, 4), torch.randn(4, 4)), {"w": torch.ones(4, 1)}, scale=1.0)
    assert out["loss"].shape == (2,)


def test_two_forwards_one_backward_and_accumulation_over_two_backwards():
    ref = small_cnn()
    dp = fastpar.DataParallel(copy.deepcopy(ref), device_ids=["cpu"] * 2)
    (x1, y1), (x2, y2) = batches([5, 6])
    for model in (ref, dp):
        (F.cross_entropy(model(x1), y1) + F.cross_entropy(model(x2), y2)).backward()
        F.cross_entropy(model(x2), y2).backward()
    for p, q in zip(dp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


class PartlyUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(3, 2)

    def forward(self, x):
        return self.used(x)


def test_unused_parameter_keeps_grad_none_like_single_device():
    dp = fastpar.DataParallel(PartlyUsed(), device_ids=["cpu"] * 2)
    dp(torch.randn(4, 3)).sum().backward()
    assert dp.module.unused.weight.grad is None
    assert dp.module.used.weight.grad is not None


def test_state_dict_has_plain_keys_and_loads_nn_data_parallel_checkpoints():
    ref = small_cnn(seed=3)
    dp = fastpar.DataParallel(small_cnn(seed=4), device_ids=["cpu"] * 2)
    assert list(dp.state_dict()) == list(ref.state_dict())
    dp.load_state_dict(nn.DataParallel(ref).state_dict())  # "module." keys
    assert_close_params(dp.module, ref, tol=0)
    dp.load_state_dict(small_cnn(seed=5).state_dict())  # plain keys
    bare = small_cnn(seed=6)
    bare.load_state_dict(dp.state_dict())
    assert_close_params(bare, small_cnn(seed=5), tol=0)
    with pytest.raises(RuntimeError, match="Missing key"):
        dp.load_state_dict({"0.weight": ref[0].weight})


def test_wrapped_inside_a_bigger_model_round_trips_state_dict():
    outer = nn.Sequential(fastpar.DataParallel(small_cnn(), device_ids=["cpu"] * 2), nn.Linear(5, 2))
    sd = outer.state_dict()
    assert "0.0.weight" in sd and "0.module.0.weight" not in sd
    outer.load_state_dict(sd)


def test_bad_arguments_are_reported_before_any_work():
    with pytest.raises(ValueError, match=r"device_ids\[1\] is 'cuda:0', the same device as device_ids\[0\]"):
        fastpar.DataParallel(small_cnn(), device_ids=[0, 0])
    with pytest.raises(ValueError, match=r"device_ids\[1\] is 'cuda:0' but device_ids\[0\] is 'cpu'"):
        fastpar.DataParallel(small_cnn(), device_ids=["cpu", 0])
    with pytest.raises(ValueError, match="empty list"):
        fastpar.DataParallel(small_cnn(), device_ids=[])
    with pytest.raises(ValueError, match="scalar_gather"):
        fastpar.DataParallel(small_cnn(), device_ids=["cpu"], scalar_gather="mean")
    dp = fastpar.DataParallel(NestedIO(), device_ids=["cpu"] * 2)
    with pytest.raises(ValueError, match=r"inputs, kwargs\)\[1\]\['extra'\]\['w'\] has size 5 along dim 0 but "
                                         r"\(inputs, kwargs\)\[0\]\[0\]\[0\] has size 4"):
        dp((torch.randn(4, 4), torch.randn(4, 4)), extra={"w": torch.randn(5, 1)}, scale=1.0)


def test_deepcopy_and_pickle_of_the_wrapper_work():
    import io
    dp = fastpar.DataParallel(small_cnn(), device_ids=["cpu"] * 2)
    x, y = batches([6])[0]
    F.cross_entropy(dp(x), y).backward()
    twin = copy.deepcopy(dp)
    buf = io.BytesIO()
    torch.save(dp, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        for other in (twin, loaded):
            torch.testing.assert_close(other(x), dp(x))


def test_updates_through_dot_data_reach_the_replicas():
    # .data updates bump no version counter: the replicas must be refreshed anyway
    ref = small_cnn()
    dp = fastpar.DataParallel(copy.deepcopy(ref), device_ids=["cpu"] * 3)
    for x, y in batches([9, 9, 9]):
        for model, params in ((ref, ref.parameters()), (dp, dp.module.parameters())):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            for p in params:
                p.data -= 0.1 * p.grad
    assert_close_params(dp.module, ref)
