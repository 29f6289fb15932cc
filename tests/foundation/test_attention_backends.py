"""`varying_shape_attention` switches cuDNN's SDPA off while any entry is open, and back to what it was."""

import threading

import pytest

torch = pytest.importorskip("torch")

from groupwise.runtime.attention_backends import varying_shape_attention  # noqa: E402


def _on() -> bool:
    return torch.backends.cuda.cudnn_sdp_enabled()


def test_off_inside_nested_entries_and_restored_after():
    assert _on()
    with varying_shape_attention():
        assert not _on()
        with varying_shape_attention():
            assert not _on()
        assert not _on()  # the inner exit leaves the outer entry's setting
    assert _on()


def test_a_setting_made_before_is_kept():
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with varying_shape_attention():
            assert not _on()
        assert not _on()  # switched off by the caller: stays off
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_entries_of_two_threads_overlapping():
    """The switch is process-wide: thread A leaving while thread B is inside must not turn it on."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with varying_shape_attention():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with varying_shape_attention():
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = _on()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"b after a left": False}
    assert _on()


def test_an_error_inside_still_restores():
    with pytest.raises(RuntimeError):
        with varying_shape_attention():
            raise RuntimeError("boom")
    assert _on()
