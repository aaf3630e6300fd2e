"""A checkpoint's files: written atomically, listed with their checksums, found by `latest`.

    ckpt_dir/step-00000120/...              one folder per checkpoint (step_dir)
    ckpt_dir/step-00000120/checksums.json   each file's sha256 and size, as written
    ckpt_dir/latest                         one line, "step-00000120": the checkpoint to load

Atomic: every file is written to a temporary name and renamed (a rename within one filesystem
is atomic); `latest` moves the same way, after every rank has written, so the previous
checkpoint stays loadable until then, and older ones beyond `keep` are removed after.
Checksums: torch.load checks none (a flipped byte in a tensor loads as a wrong weight), so
every file is read whole and its sha256 and size compared with checksums.json first, whose own
digest is checked too. What goes into the files, and back: checkpoint.py.
"""
import hashlib
import io
import json
import os
import shutil

import torch

LATEST = "latest"
CHECKSUMS = "checksums.json"


def _atomic_write(data, path):
    """Bytes to a temporary name, flushed to disk, then renamed into place."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_save(obj, path):
    """torch.save, written atomically. Returns the file's checksum entry {sha256, bytes}."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    _atomic_write(data, path)
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _atomic_write_text(text, path):
    """Write text to path atomically (a temporary file renamed over it)."""
    _atomic_write(text.encode(), path)


def step_dir(ckpt_dir, step):
    """The folder of step `step`'s checkpoint in ckpt_dir: step-00000042."""
    return os.path.join(ckpt_dir, f"step-{step:08d}")


def _remove_old(ckpt_dir, keep):
    """Delete all but the newest `keep` step folders (never the one `latest` names);
    keep=0 or None keeps all."""
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))
    latest = latest_checkpoint(ckpt_dir)
    for name in steps[:-keep] if keep else []:
        if os.path.join(ckpt_dir, name) != latest:
            shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


def latest_checkpoint(ckpt_dir):
    """The folder `latest` names, or None when nothing was completely written yet."""
    try:
        with open(os.path.join(ckpt_dir, LATEST)) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(ckpt_dir, name)


def _digest(listed):
    return hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()


def _write_checksums(folder, listed):
    """{file name: {sha256, bytes}}, with a sha256 of its own: a changed byte in it shows too."""
    text = json.dumps({"files": listed, "sha256": _digest(listed)}, indent=1, sort_keys=True)
    _atomic_write(text.encode(), os.path.join(folder, CHECKSUMS))


def _checksums(folder):
    """The {file name: sha256} the checkpoint in folder lists, its own digest checked (a
    ValueError when it is missing or damaged)."""
    path = os.path.join(folder, CHECKSUMS)
    try:
        with open(path, "rb") as f:
            content = json.loads(f.read().decode())
        if _digest(content["files"]) != content["sha256"]:
            raise ValueError("its own sha256 does not match what it lists")
        return content["files"]
    except FileNotFoundError:
        raise ValueError(f"checkpoint {folder} has no {CHECKSUMS}: it was not written "
                         "completely (or by an older save_checkpoint): nothing in it can be "
                         "verified") from None
    except Exception as e:  # noqa: BLE001 - not JSON, not the layout: damaged either way
        raise ValueError(f"checkpoint file {path} is damaged: {type(e).__name__}: "
                         f"{str(e)[:200]}") from e


def _verified(path, listed):
    """The bytes of a checkpoint file, once they are the ones save_checkpoint wrote (its
    size and sha256 as listed in checksums.json): a ValueError naming the file if not."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"checkpoint file {path} is missing or unreadable: {e}") from e
    want = listed.get(name)
    if want is None:
        raise ValueError(f"checkpoint file {path} is damaged: {CHECKSUMS} does not list it")
    if len(data) != want["bytes"]:
        raise ValueError(f"checkpoint file {path} is damaged: {len(data)} bytes, "
                         f"{want['bytes']} were written (truncated, or grown)")
    if hashlib.sha256(data).hexdigest() != want["sha256"]:
        raise ValueError(f"checkpoint file {path} is damaged: its sha256 is not the one written "
                         f"with it in {CHECKSUMS} (a changed byte, in the one or the other)")
    return data
