"""A weight tag without network (issue 50 item 6): one line within seconds, not huggingface_hub's ~58 s of
retries, whose suggestion works as typed; HF_HUB_OFFLINE=1 reads torch.hub's checkpoints folder as well as the
Hugging Face cache. Never the network: the probe and the Hub download are faked."""

from __future__ import annotations

import time

import huggingface_hub
import pytest
import torch

import resmlp
from resmlp.cli import main
from resmlp.models import weight_tags
from resmlp.models.resmlp import ResMLP, ResMLPConfig

SMALL = ResMLPConfig(img_size=16, patch_size=4, dim=16, depth=1, num_classes=5)


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """Empty caches (HF_HOME, TORCH_HOME), HF_HUB_OFFLINE unset, the probe finding no network, and a Hub download
    that records whether it was asked to stay local (and fails, as it would offline)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(weight_tags, "_connects", lambda host, port: False)  # neither the Hub nor the URL
    asked = []

    def download(repo_id, filename, local_files_only=False, **kwargs):
        asked.append(local_files_only)
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return asked


def test_a_tag_without_network_fails_in_seconds_naming_a_place_that_works(no_network, tmp_path, monkeypatch,
                                                                           capsys):
    start = time.perf_counter()
    assert main(["eval", "resmlp_s12.fb_in1k", "--data", "synthetic"]) == 2
    assert time.perf_counter() - start < 5.0
    assert no_network and all(no_network)  # the cache looked at, nothing downloaded
    err = capsys.readouterr().err.strip()
    hub_file = tmp_path / "torch" / "hub" / "checkpoints" / "resmlp_12_no_dist.pth"
    assert len(err.splitlines()) == 1 and "nor the original URL can be reached" in err and str(hub_file) in err
    # the suggestion as typed: the file placed there is read, offline too
    torch.manual_seed(0)
    model = ResMLP(SMALL).eval()
    resmlp.export_checkpoint(model, hub_file, format="deit")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert weight_tags.tagged_weights("resmlp_s12.fb_in1k") == hub_file
    assert main(["export", "resmlp_s12.fb_in1k", "--output", str(tmp_path / "m.pt2")]) == 0
    assert "input (batch, 3, 16, 16)" in capsys.readouterr().out


def test_create_model_pretrained_without_network_fails_fast_and_reads_torch_hubs_file(no_network, tmp_path):
    from resmlp.checkpoint import WeightsUnavailableError
    from resmlp.models.pretrained import resolve_weights_file

    cfg = dict(architecture="resmlp_s12", hf_hub_id="timm/resmlp_12_224.fb_in1k",
               url="https://dl.fbaipublicfiles.com/deit/resmlp_12_no_dist.pth")
    start = time.perf_counter()
    with pytest.raises(WeightsUnavailableError, match="can be reached") as refused:
        resolve_weights_file(cfg)
    assert time.perf_counter() - start < 5.0 and all(no_network)
    hub_file = tmp_path / "torch" / "hub" / "checkpoints" / "resmlp_12_no_dist.pth"
    assert str(hub_file) in str(refused.value) and "checkpoint_path=" in str(refused.value)
    hub_file.parent.mkdir(parents=True)
    hub_file.write_bytes(b"weights")
    assert resolve_weights_file(cfg) == hub_file


def test_the_probe_gives_up_within_its_bound_whatever_the_lookup_takes(monkeypatch):
    """A DNS lookup takes no timeout: the probe waits PROBE_SECONDS at most, then counts the Hub out of reach."""
    monkeypatch.setattr(weight_tags, "PROBE_SECONDS", 0.2)

    def lookup_that_hangs(*args, **kwargs):
        time.sleep(3)  # > PROBE_SECONDS: the probe has given up by then
        raise OSError("name resolution timed out")

    monkeypatch.setattr(weight_tags.socket, "create_connection", lookup_that_hangs)
    weight_tags._connects.cache_clear()
    start = time.perf_counter()
    assert weight_tags._connects("hub.invalid", 443) is False
    assert time.perf_counter() - start < 2.0
    weight_tags._connects.cache_clear()


def test_the_hub_out_of_reach_but_the_original_url_in_reach_downloads_from_the_url(no_network, tmp_path,
                                                                                   monkeypatch):
    import resmlp.checkpoint

    monkeypatch.setattr(weight_tags, "_connects", lambda host, port: host == "dl.fbaipublicfiles.com")
    fetched = tmp_path / "fetched.pth"
    monkeypatch.setattr(resmlp.checkpoint, "download_published", lambda url: fetched)
    assert weight_tags.tagged_weights("resmlp_s12.fb_in1k") == fetched
    assert no_network and all(no_network)  # the Hub only looked at in its cache
