import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def session_minari_home(tmp_path_factory):
    """The Minari datasets that module-wide fixtures write or read live in a temporary folder."""
    path = tmp_path_factory.mktemp("minari")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(path))
    yield path
    mp.undo()


@pytest.fixture(autouse=True)
def minari_home(tmp_path_factory, monkeypatch):
    """Every Minari dataset a test writes or reads lives in a temporary folder of its own: no test sees what
    another made, whichever test process runs it and in whatever order."""
    path = tmp_path_factory.mktemp("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


def make_episodes(lengths=(7, 3, 12), obs_dim=11, act_dim=3, seed=0):
    """Hopper-sized episodes in the Minari layout (T+1 observations); the last one times out."""
    rng = np.random.default_rng(seed)
    eps = []
    for i, n in enumerate(lengths):
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        (trunc if i == len(lengths) - 1 else term)[-1] = True
        eps.append(
            dict(
                observations=rng.normal(size=(n + 1, obs_dim)).astype(np.float32),
                actions=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
                rewards=rng.normal(size=n).astype(np.float32),
                terminations=term,
                truncations=trunc,
            )
        )
    return eps
