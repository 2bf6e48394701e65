"""dist.all_reduce on a CPU fastpar group hands out the previous call's Work
again once nobody holds it (shm_engine.cpp, recycle): a Work the caller keeps
must keep its own tensors and future whatever calls follow."""


def test_kept_work_keeps_its_result(one_rank_group):
    import torch
    import torch.distributed as dist

    a, b = torch.full((8,), 1.0), torch.full((8,), 2.0)
    wa = dist.all_reduce(a, async_op=True)
    fa = wa.get_future()
    wb = dist.all_reduce(b, async_op=True)
    assert wa is not wb
    for _ in range(3):  # dropped works may be reused; the kept ones are not
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    assert wa.wait() and wb.wait()
    assert fa.value()[0].data_ptr() == a.data_ptr()
    assert wa.get_future().value()[0].data_ptr() == a.data_ptr()
    assert wb.get_future().value()[0].data_ptr() == b.data_ptr()
    assert torch.equal(a, torch.full((8,), 1.0)) and torch.equal(b, torch.full((8,), 2.0))


def test_reused_work_has_the_new_call(one_rank_group):
    import torch
    import torch.distributed as dist

    first = torch.ones(4)
    w = dist.all_reduce(first, async_op=True)
    f = w.get_future()
    del w
    second = torch.ones(6)
    w2 = dist.all_reduce(second, async_op=True)
    assert w2.get_future().value()[0].data_ptr() == second.data_ptr()
    assert f.value()[0].data_ptr() == first.data_ptr()  # a future taken earlier stays the first call's
