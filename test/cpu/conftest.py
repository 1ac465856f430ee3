"""Fixtures shared by the CPU tests."""
import pytest


@pytest.fixture(scope="module")
def one_thread():
    """Reference forwards are many tiny ops: one torch thread is far faster on a busy 2-core box."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def env_value(monkeypatch):
    """env_value(NAME, raw): NAME set to raw for the test, or unset when raw is None."""
    def apply(name, raw):
        if raw is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, raw)
    return apply
