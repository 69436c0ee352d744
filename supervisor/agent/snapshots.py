"""Snapshots of a run's data files before a start, and putting them back.

Standard library only, Python >= 3.8 (runs on the host inside the agent). Every start of a client
over existing data first makes a recoverable copy of each data file it hands the client: a
reflink (``ioctl(FICLONE)``: the copy shares the file's blocks, free on btrfs and XFS) where the
filesystem has it, else a byte copy (``copy_file_range``, else read/write; verified by SHA-256)
within a byte limit, else nothing (the laptop refuses the start unless forced).

A snapshot is a directory ``<root>/<UTC stamp>/`` (``root``: ``<out>/.runwatch/snapshots/<run>``)
holding one copy per file and ``manifest.json`` (what each copy is a copy of: path, size, device
and inode, mode, method). Directories and files are runwatch's own (0700 / 0600, ``O_EXCL``,
``O_NOFOLLOW``); a data file that is a symbolic link is never followed (it stays unprotected).
Every data path -- a file kept, checked, verified or put back -- is reached from ``/`` one
directory descriptor at a time (:func:`safefs.walk`): a directory on its way that is another
user's link (a dataset directory of a shared 0777 parent replaced by one) is never followed, the
file is unprotected with the link named (so a start is refused) and a restore is refused
(``unsafe-path``); the last name is then opened, created or moved relative to that descriptor.

Ops:
- ``snapshot_check``: whether each file *can* be kept (reflink probe, size against the limit),
  asked before anything stops; it copies nothing (a probe clone is made and removed at once).
- ``snapshot_take``: the snapshot itself, right before the launch request; prunes to ``keep``.
- ``snapshot_verify``: which files of a snapshot shrank or were replaced (another inode) since.
- ``snapshot_restore``: put files of a snapshot back, only with no writer alive; the current
  file is moved aside to ``<file>.after-<stamp>``, never deleted.
- ``snapshot_list``: the snapshots of a root, newest first.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import stat
from typing import Any

from supervisor.agent import datafiles, safefs
from supervisor.agent.protocol import AgentOpError, param_str

MANIFEST = "manifest.json"
VERSION = 1
_FICLONE = 0x40049409
"""``ioctl(dst, FICLONE, src)``: share the source's blocks (a reflink) on btrfs, XFS..."""
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


def _stamp() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S.%fZ")


def _paths(params: dict[str, Any]) -> list[str]:
    paths = params.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise AgentOpError("parameter 'paths': expected a list of strings", "bad-params")
    out: list[str] = []
    for p in paths:
        r = datafiles.resolve(p)
        if r not in out:
            out.append(r)
    return out


def _limit(params: dict[str, Any]) -> int:
    limit = params.get("max_bytes")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise AgentOpError("parameter 'max_bytes': expected a non-negative integer", "bad-params")
    return limit


def _root(params: dict[str, Any]) -> str:
    root = datafiles.resolve(param_str(params, "root"))
    if os.path.basename(os.path.dirname(root)) != "snapshots":
        raise AgentOpError(f"{root} is not a snapshot root (.../snapshots/RUN)", "bad-params")
    return root


def _make_root(root: str) -> None:
    """``<out>/.runwatch/snapshots/<run>``: each level from ``.runwatch`` private and checked."""
    try:
        safefs.make_dirs(root, os.path.dirname(os.path.dirname(root)), private_parents=False)
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None


def _unsafe(e: safefs.UnsafePath) -> AgentOpError:
    return AgentOpError(str(e), "unsafe-path")


def _link_reason(path: str, dfd: int, name: str) -> str:
    """Why the link ``name`` in ``dfd`` (the last name of ``path``) is not kept: never followed,
    and named as refused when it is another user's."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=dfd)
    except OSError:
        return "it is a symbolic link (never followed)"
    if stat.S_ISLNK(st.st_mode) and not safefs.trusted_link(st):
        return str(safefs.refuse_link(path, path, st, target))
    return "it is a symbolic link (never followed)"


def _open_source(path: str) -> tuple[int | None, str]:
    """``(fd, "")`` of a regular data file opened without following a link, or ``(None, why)``
    (``""`` when it is missing: nothing to keep). Its directories are reached by
    :func:`safefs.walk`: another user's link on the way is the reason, naming the link."""
    try:
        dfd, name = safefs.walk(path, follow_last=False)
    except safefs.UnsafePath as e:
        return None, str(e)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"it cannot be read ({e.strerror})"
    try:
        # O_NONBLOCK: a FIFO in the file's place never blocks the agent (a regular file
        # ignores the flag).
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, _link_reason(path, dfd, name)
        return None, f"it cannot be read ({e.strerror})"
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, "it is not a regular file"
    return fd, ""


def _create_at(dfd: int, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` in the directory ``dfd`` (``O_EXCL``, never through a link)."""
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS, mode, dir_fd=dfd)
    os.fchmod(fd, mode)
    return fd


def _new_file(path: str, mode: int = 0o600) -> int:
    """A new file at ``path``, its directories reached by :func:`safefs.walk`."""
    dfd, name = safefs.walk(path, follow_last=False)
    try:
        return _create_at(dfd, name, mode)
    finally:
        os.close(dfd)


def reflink(src: int, dst: int) -> bool:
    """Whether ``dst`` now shares every block of ``src`` (``FICLONE``); False where the
    filesystem cannot (another filesystem, no reflink support)."""
    try:
        import fcntl

        fcntl.ioctl(dst, _FICLONE, src)
        return True
    except (ImportError, OSError):
        return False


def copy_bytes(src: int, dst: int, size: int) -> str:
    """Copy ``size`` bytes of ``src`` to ``dst`` without a reflink: ``os.copy_file_range``
    (in-kernel) where it works, else read/write. Returns the method used."""
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            while done < size:
                n = copy_range(src, dst, size - done, done, done)
                if n == 0:
                    break
                done += n
            if done == size:
                return "copy_file_range"
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
    while done < size:
        chunk = os.pread(src, min(1 << 20, size - done), done)
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            n = os.pwrite(dst, view, done)
            view = view[n:]
            done += n
    os.ftruncate(dst, size)
    return "copy"


def _sha256_fd(fd: int, size: int) -> str:
    h = hashlib.sha256()
    off = 0
    while off < size:
        block = os.pread(fd, min(1 << 20, size - off), off)
        if not block:
            break
        h.update(block)
        off += len(block)
    return h.hexdigest()


WINDOW = 64 << 10
"""Bytes hashed at the head and at the end of a kept file: a file rewritten from its start
(opened with "w") and grown back past its old size differs there."""


def _windows(fd: int, size: int) -> tuple[str, str]:
    """SHA-256 of the first and of the last :data:`WINDOW` bytes of the first ``size`` bytes."""
    head = os.pread(fd, min(WINDOW, size), 0)
    start = max(0, size - WINDOW)
    tail = os.pread(fd, size - start, start)
    return hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest()


def _probe_reflink(src: int, root: str) -> bool:
    probe = f".probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        dfd, _ = safefs.walk(os.path.join(root, probe), follow_last=False)
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None
    try:
        fd = _create_at(dfd, probe)
        try:
            return reflink(src, fd)
        finally:
            os.close(fd)
            os.unlink(probe, dir_fd=dfd)
    finally:
        os.close(dfd)


# --------------------------------------------------------------------------- check


def snapshot_check(params: dict[str, Any]) -> dict[str, Any]:
    """``{paths, root, max_bytes}`` -> how each file would be kept: ``{"files": [{"path",
    "size", "method": "reflink"|"copy"|"none"|"empty", "reason"?}], "copy_bytes",
    "unprotected": [text]}``. ``copy`` files hold ``copy_bytes`` together; past ``max_bytes``
    they are ``none``. Copies nothing; made before anything stops."""
    paths = _paths(params)
    root = _root(params)
    limit = _limit(params)
    files: list[dict[str, Any]] = []
    copy_total = 0
    made = False
    for path in paths:
        fd, why = _open_source(path)
        if fd is None:
            entry: dict[str, Any] = {
                "path": path,
                "size": 0,
                "method": "empty" if not why else "none",
            }
            if why:
                entry["reason"] = why
            files.append(entry)
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                files.append({"path": path, "size": 0, "method": "empty"})
                continue
            if not made:
                _make_root(root)
                made = True
            if _probe_reflink(fd, root):
                files.append({"path": path, "size": size, "method": "reflink"})
            elif copy_total + size <= limit:
                copy_total += size
                files.append({"path": path, "size": size, "method": "copy"})
            else:
                files.append(
                    {
                        "path": path,
                        "size": size,
                        "method": "none",
                        "reason": f"no reflink on its filesystem and {copy_total + size} bytes "
                        f"to copy are more than backup_max_bytes ({limit})",
                    }
                )
        finally:
            os.close(fd)
    unprotected = [f"{f['path']}: {f['reason']}" for f in files if f["method"] == "none"]
    return {"files": files, "copy_bytes": copy_total, "unprotected": unprotected}


# --------------------------------------------------------------------------- take


def _keep_one(path: str, fd: int, dest: str, budget: list[int]) -> dict[str, Any]:
    st = os.fstat(fd)
    size = st.st_size
    entry: dict[str, Any] = {
        "path": path,
        "bytes": size,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
    }
    # The complete lines are what a start must not lose: a client may cut a torn last line.
    entry["complete"] = datafiles._last_newline(fd, size)
    entry["head"], entry["tail"] = _windows(fd, entry["complete"])
    target = datafiles._free_name(os.path.join(dest, os.path.basename(path)))
    try:
        out = _new_file(target)
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None
    try:
        if reflink(fd, out):
            method = "reflink"
        elif size <= budget[0]:
            method = copy_bytes(fd, out, size)
            budget[0] -= size
        else:
            method = ""
        if method:
            os.fsync(out)
            got = os.fstat(out).st_size
            if got != size:
                raise AgentOpError(f"the copy of {path} in {target} has {got} bytes, not {size}")
            if method != "reflink":  # a reflink shares the very blocks; a copy is checked
                entry["sha256"] = _sha256_fd(fd, size)
                if _sha256_fd(out, size) != entry["sha256"]:
                    raise AgentOpError(f"the copy of {path} in {target} differs from it", "io")
    finally:
        os.close(out)
    if not method:
        dfd, name = safefs.walk(target, follow_last=False)
        try:
            os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)
        entry.update(method="none", reason="no reflink and over backup_max_bytes")
        return entry
    entry.update(copy=target, method=method)
    return entry


def snapshot_take(params: dict[str, Any]) -> dict[str, Any]:
    """``{paths, root, max_bytes, keep, run?, reason?}`` -> ``{"id", "dir", "files": [entry],
    "unprotected": [text], "pruned": [dir]}``: a copy of every existing non-empty file in a new
    ``<root>/<stamp>/`` (reflink, else a verified copy within ``max_bytes``), its manifest, then
    the snapshots of ``root`` beyond the newest ``keep`` removed. ``id`` is empty when there was
    nothing to keep (no snapshot made)."""
    paths = _paths(params)
    root = _root(params)
    limit = _limit(params)
    keep = params.get("keep")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise AgentOpError("parameter 'keep': expected a positive integer", "bad-params")
    sources: list[tuple[str, int]] = []
    unprotected: list[str] = []
    try:
        for path in paths:
            fd, why = _open_source(path)
            if fd is None:
                if why:
                    unprotected.append(f"{path}: {why}")
                continue
            if os.fstat(fd).st_size == 0:
                os.close(fd)
                continue
            sources.append((path, fd))
        if not sources:
            return {"id": "", "dir": "", "files": [], "unprotected": unprotected, "pruned": []}
        _make_root(root)
        dest = datafiles._free_name(os.path.join(root, _stamp()))
        try:
            safefs.make_dirs(dest, dest)
        except safefs.UnsafePath as e:
            raise AgentOpError(str(e), "unsafe-path") from None
        budget = [limit]
        files = []
        try:
            for path, fd in sources:
                entry = _keep_one(path, fd, dest, budget)
                if entry["method"] == "none":
                    unprotected.append(f"{path}: {entry['reason']}")
                files.append(entry)
        except BaseException:
            _remove(dest)  # a snapshot without its manifest would never be listed nor pruned
            raise
    finally:
        for _, fd in sources:
            os.close(fd)
    manifest = {
        "version": VERSION,
        "id": os.path.basename(dest),
        "run": str(params.get("run") or ""),
        "reason": str(params.get("reason") or ""),
        "time": datetime.datetime.now(datetime.timezone.utc).timestamp(),
        "files": files,
        "unprotected": unprotected,
    }
    safefs.write_atomic(os.path.join(dest, MANIFEST), json.dumps(manifest, indent=1).encode())
    datafiles.fsync_dir(dest)
    pruned = prune(root, keep)
    return {
        "id": manifest["id"],
        "dir": dest,
        "files": files,
        "unprotected": unprotected,
        "pruned": pruned,
    }


def _manifest(dest: str) -> dict[str, Any] | None:
    try:
        data = json.loads(safefs.read_private(os.path.join(dest, MANIFEST)))
    except (OSError, ValueError, safefs.UnsafePath):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


def _snapshot_dirs(root: str) -> list[str]:
    """The snapshot directories of ``root`` (runwatch's own: real directories with a manifest),
    oldest first."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        path = os.path.join(root, name)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and _manifest(path) is not None:
            out.append(path)
    return out


def _remove(path: str) -> None:
    """Remove a snapshot directory runwatch made: its files (links are removed, never
    followed), then the directory; a subdirectory (never made by runwatch) keeps it."""
    for name in os.listdir(path):
        target = os.path.join(path, name)
        if stat.S_ISDIR(os.lstat(target).st_mode):
            continue
        os.unlink(target)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def prune(root: str, keep: int) -> list[str]:
    """Remove the snapshots of ``root`` older than the newest ``keep``; the ones removed. Only
    runwatch's own snapshot directories (with a manifest) go, never through a link."""
    dirs = _snapshot_dirs(root)
    gone = dirs[: max(0, len(dirs) - keep)]
    for path in gone:
        _remove(path)
    return gone


# --------------------------------------------------------------------------- verify, restore


def _dest(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    root = _root(params)
    sid = param_str(params, "id")
    if "/" in sid or sid in ("", ".", ".."):
        raise AgentOpError(f"snapshot id {sid!r} is not a name", "bad-params")
    dest = os.path.join(root, sid)
    manifest = _manifest(dest)
    if manifest is None:
        raise AgentOpError(f"no snapshot {sid} in {root}", "missing")
    return dest, manifest


def _damage(entry: dict[str, Any]) -> str:
    """Why the file of ``entry`` lost data since its snapshot ("": it did not). Reached by
    :func:`safefs.walk`: a directory on its way that became another user's link is damage (the
    file is no longer where it was kept), never followed."""
    path = entry["path"]
    try:
        dfd, name = safefs.walk(path, follow_last=False)
    except safefs.UnsafePath as e:
        return f"it is no longer reached safely: {e}"
    except FileNotFoundError:
        return "it is gone"
    except OSError as e:
        return f"it cannot be reached ({e.strerror})"
    try:
        return _damage_at(entry, dfd, name)
    finally:
        os.close(dfd)


def _damage_at(entry: dict[str, Any], dfd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return "it is gone"
    if (st.st_dev, st.st_ino) != (entry.get("dev"), entry.get("ino")):
        return f"it was replaced (inode {entry.get('ino')} -> {st.st_ino})"
    size = int(entry.get("complete", entry.get("bytes")) or 0)
    if st.st_size < size:
        return f"it shrank ({size} bytes of complete lines -> {st.st_size} bytes)"
    if "head" in entry and size > 0:
        if not stat.S_ISREG(st.st_mode):
            return "it is no longer a regular file"
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=dfd)
        except OSError as e:
            return f"it cannot be read ({e.strerror})"
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return f"it was replaced (inode {entry.get('ino')} -> {now.st_ino})"
            if _windows(fd, size) != (entry["head"], entry["tail"]):
                return f"it was rewritten (its first or last bytes of the {size} kept differ)"
        finally:
            os.close(fd)
    return ""


def snapshot_verify(params: dict[str, Any]) -> dict[str, Any]:
    """``{root, id}`` -> ``{"damaged": [{"path", "why", "bytes_before", "bytes_now"}]}``: the
    kept files that shrank, were replaced (another inode) or are gone since the snapshot."""
    _, manifest = _dest(params)
    damaged = []
    for entry in manifest["files"]:
        if not entry.get("copy"):
            continue
        why = _damage(entry)
        if why:
            try:
                now = safefs.lstat(entry["path"]).st_size
            except (OSError, safefs.UnsafePath):
                now = 0
            damaged.append(
                {
                    "path": entry["path"],
                    "why": why,
                    "bytes_before": entry["bytes"],
                    "bytes_now": now,
                }
            )
    return {"damaged": damaged}


def _reach(path: str) -> tuple[int, str]:
    """``safefs.walk(path, follow_last=False)`` of a data file a restore writes: another user's
    link on the way is refused (``unsafe-path``)."""
    try:
        return safefs.walk(path, follow_last=False)
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None


def _put_back(entry: dict[str, Any], stamp: str) -> dict[str, Any]:
    path, copy = entry["path"], entry["copy"]
    try:
        src = safefs.open_existing(copy)
    except safefs.UnsafePath as e:
        raise _unsafe(e) from None
    try:
        if os.fstat(src).st_size != entry["bytes"]:
            raise AgentOpError(f"the snapshot copy {copy} is not {entry['bytes']} bytes", "io")
        dfd, name = _reach(path)
        try:
            # The current file (a link as a link, never followed) moved aside, then the copy
            # made in its place: both relative to the one descriptor of its directory.
            aside = datafiles._move_at(path, dfd, name, "after", stamp).get("to")
            mode = int(entry.get("mode") or 0o600)
            dst = _create_at(dfd, name, mode)
            try:
                with contextlib.suppress(OSError):
                    os.fchown(dst, int(entry.get("uid", -1)), int(entry.get("gid", -1)))
                with contextlib.suppress(OSError):
                    os.fchmod(dst, mode)
                method = "reflink" if reflink(src, dst) else copy_bytes(src, dst, entry["bytes"])
                os.fsync(dst)
                if entry.get("sha256") and _sha256_fd(dst, entry["bytes"]) != entry["sha256"]:
                    raise AgentOpError(
                        f"{path} restored from {copy} differs from the snapshot", "io"
                    )
            finally:
                os.close(dst)
            safefs.fsync_dir_fd(dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(src)
    return {"path": path, "source": copy, "aside": aside, "bytes": entry["bytes"], "method": method}


def snapshot_restore(params: dict[str, Any]) -> dict[str, Any]:
    """``{root, id, paths?, damaged_only?}`` -> ``{"restored": [{"path", "source", "aside",
    "bytes", "method"}]}``: each kept file (those of ``paths``, default all; with
    ``damaged_only`` only those that shrank or were replaced) put back as it was at the
    snapshot, its current file moved aside to ``<file>.after-<stamp>`` (never deleted).
    Refused (``writer-alive``, nothing touched) while any process has one of them open for
    writing."""
    _, manifest = _dest(params)
    wanted = params.get("paths")
    if wanted is not None and (
        not isinstance(wanted, list) or not all(isinstance(p, str) for p in wanted)
    ):
        raise AgentOpError("parameter 'paths': expected a list of strings", "bad-params")
    chosen = [e for e in manifest["files"] if e.get("copy")]
    if wanted is not None:
        resolved = {datafiles.resolve(p) for p in wanted}
        unknown = resolved - {e["path"] for e in chosen}
        if unknown:
            raise AgentOpError(
                f"not in snapshot {manifest['id']}: {', '.join(sorted(unknown))}", "missing"
            )
        chosen = [e for e in chosen if e["path"] in resolved]
    if params.get("damaged_only"):
        chosen = [e for e in chosen if _damage(e)]
    for e in chosen:  # every path reached safely before any file is touched
        dfd, name = _reach(e["path"])
        try:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode) and not safefs.trusted_link(st):
                    target = os.readlink(name, dir_fd=dfd)
                    raise _unsafe(safefs.refuse_link(e["path"], e["path"], st, target))
        finally:
            os.close(dfd)
    writers = {e["path"]: datafiles.writers_of(e["path"]) for e in chosen}
    busy = {p: w for p, w in writers.items() if w}
    if busy:
        raise AgentOpError(
            "; ".join(
                f"{p} is open for writing by pid {', '.join(map(str, w))}" for p, w in busy.items()
            )
            + "; a snapshot is put back only with no writer alive",
            "writer-alive",
        )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return {"restored": [_put_back(e, stamp) for e in chosen]}


def snapshot_list(params: dict[str, Any]) -> dict[str, Any]:
    """``{root}`` -> ``{"snapshots": [{"id", "dir", "run", "reason", "time", "files",
    "unprotected"}]}``, newest first."""
    root = _root(params)
    out = []
    for dest in reversed(_snapshot_dirs(root)):
        m = _manifest(dest) or {}
        files = [
            {k: e.get(k) for k in ("path", "copy", "bytes", "method")} for e in m.get("files") or []
        ]
        out.append(
            {
                "id": os.path.basename(dest),
                "dir": dest,
                "run": m.get("run") or "",
                "reason": m.get("reason") or "",
                "time": float(m.get("time") or 0),
                "files": files,
                "unprotected": list(m.get("unprotected") or []),
            }
        )
    return {"snapshots": out}
