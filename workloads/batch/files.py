"""The files of a batch job: prompts in, one output file per chunk out, each written exactly once.

Glossary:

- **input**: JSON Lines, one prompt per line: a JSON string, or an object ``{"prompt": str,
  "max_new_tokens": int, "temperature": float, "id": str}`` (all but ``prompt`` optional); a
  file, or a folder whose ``*.jsonl`` files are read in name order. Local or ``gs://``.
- **row**: a prompt's place in the input, 0-based over all files; it names the prompt in the
  output.
- **chunk**: rows ``[k * chunk_rows, (k + 1) * chunk_rows)``: one Ray Data block in, one output
  file out, ``part-<k>.jsonl`` (:func:`part_name`). The name depends only on ``k``, so a chunk
  computed again (an actor killed mid-chunk, or the job run again) is written to the same name
  with the same lines: it replaces, never adds.
- **atomic write**: a local file is written under a temporary name in the same folder and
  renamed over the final one (POSIX rename: a reader sees the old file or the new one, never
  half of one); a ``gs://`` object is uploaded in one request, and GCS creates an object only
  when its upload completes.
- **job file**: ``_job.json`` in the output folder, what the outputs were computed with
  (:func:`check_job_file`): a second run into the same folder resumes only the same job.

Every row of the input is checked before anything starts: a bad one is refused with its file,
line, field, value and the valid values (:func:`raytpu.errors.invalid`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raytpu.errors import invalid
from workloads.storage import is_remote, join

PART_PREFIX = "part-"
PART_SUFFIX = ".jsonl"
JOB_FILE = "_job.json"
INPUT_FIELDS = ("prompt", "max_new_tokens", "temperature", "id")
MAX_PROMPT_BYTES = 16_384
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Prompt:
    """One input row, checked; ``max_new_tokens``/``temperature`` ``None``: the job's default."""

    row: int
    prompt: str
    max_new_tokens: int | None = None
    temperature: float | None = None
    id: str = ""


def filesystem(path: str) -> Any:
    """The fsspec filesystem of ``path``: gcsfs for ``gs://`` (anonymous on the emulator), else
    the local one."""
    if not is_remote(path):
        import fsspec

        return fsspec.filesystem("file")
    import gcsfs

    from workloads.storage import quiet_clients

    quiet_clients()
    emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    return gcsfs.GCSFileSystem(
        token="anon" if emulated else None,
        skip_instance_cache=True,
        use_listings_cache=False,
        requests_timeout=60,
    )


def input_files(field: str, path: str, fs: Any) -> list[str]:
    """``path`` if it is a file, else its ``*.jsonl`` files in name order; refused (naming
    ``field``) when there is none."""
    if fs.isfile(path):
        return [path]
    if fs.isdir(path):
        found = sorted(p for p in fs.ls(path, detail=False) if p.endswith(PART_SUFFIX))
        if found:
            prefix = "gs://" if is_remote(path) else ""
            return [p if p.startswith(prefix) else prefix + p for p in found]
        raise ValueError(invalid(field, path, "a folder holding *.jsonl files", reason="none"))
    raise ValueError(
        invalid(field, path, "a JSON Lines file or a folder of *.jsonl files", reason="not found")
    )


def parse_line(where: str, row: int, line: str) -> Prompt:
    """One input line as a :class:`Prompt`; ``ValueError`` naming ``where`` and the field."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        valid = 'a JSON string or an object {"prompt": ...}'
        raise ValueError(invalid(where, line[:80], valid, reason=error.msg)) from None
    if isinstance(raw, str):
        raw = {"prompt": raw}
    if not isinstance(raw, dict):
        raise ValueError(invalid(where, raw, 'a JSON string or an object {"prompt": ...}'))
    unknown = sorted(set(raw) - set(INPUT_FIELDS))
    if unknown:
        raise ValueError(invalid(f"{where}.{unknown[0]}", raw[unknown[0]], INPUT_FIELDS))
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(invalid(f"{where}.prompt", prompt, "a non-empty string"))
    try:
        size = len(prompt.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(
            invalid(f"{where}.prompt", prompt[:40], "text that encodes as UTF-8")
        ) from None
    if size > MAX_PROMPT_BYTES:
        raise ValueError(
            invalid(f"{where}.prompt", f"{size} bytes", f"at most {MAX_PROMPT_BYTES} bytes")
        )
    tokens = raw.get("max_new_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise ValueError(invalid(f"{where}.max_new_tokens", tokens, "an integer >= 1"))
    temperature = raw.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise ValueError(invalid(f"{where}.temperature", temperature, "a number >= 0"))
    ident = raw.get("id", "")
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        raise ValueError(invalid(f"{where}.id", ident, "a string or an integer"))
    return Prompt(
        row, prompt, tokens, None if temperature is None else float(temperature), str(ident)
    )


def read_prompts(field: str, path: str, fs: Any | None = None) -> list[Prompt]:
    """Every prompt of the input ``path`` (local or ``gs://``), each line checked; refused with
    ``<file>:<line>`` and the field on the first bad one, or when there is no prompt at all."""
    fs = fs or filesystem(path)
    prompts: list[Prompt] = []
    for name in input_files(field, path, fs):
        with fs.open(name, "rb") as handle:
            data = handle.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                invalid(field, name, "UTF-8 JSON Lines", reason=f"byte {error.start}")
            ) from None
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                prompts.append(parse_line(f"{name}:{number}", len(prompts), line))
    if not prompts:
        raise ValueError(invalid(field, path, "at least one prompt", reason="no lines"))
    return prompts


def part_name(chunk: int) -> str:
    return f"{PART_PREFIX}{chunk:06d}{PART_SUFFIX}"


def chunk_of(name: str) -> int | None:
    """The chunk of an output file name (``part-000012.jsonl`` -> 12); ``None`` for others."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    if not (base.startswith(PART_PREFIX) and base.endswith(PART_SUFFIX)):
        return None
    digits = base[len(PART_PREFIX) : -len(PART_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def chunks(count: int, chunk_rows: int) -> list[range]:
    """The rows of each chunk of ``count`` rows."""
    return [range(s, min(s + chunk_rows, count)) for s in range(0, count, chunk_rows)]


def done_chunks(output: str, fs: Any | None = None) -> set[int]:
    """The chunks whose output file exists (complete: files appear whole, :func:`write_atomic`)."""
    fs = fs or filesystem(output)
    if not fs.exists(output):
        return set()
    names = fs.ls(output, detail=False)
    return {c for c in (chunk_of(n) for n in names) if c is not None}


def write_atomic(path: str, data: bytes, fs: Any | None = None) -> None:
    """``data`` at ``path``, appearing whole or not at all (see the module's glossary)."""
    if is_remote(path):
        (fs or filesystem(path)).pipe_file(path, data)
        return
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(temporary_name(path, os.getpid()))
    with temporary.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)


def temporary_name(path: str, pid: int) -> str:
    """Where :func:`write_atomic` writes ``path`` before the rename (hidden, per process)."""
    final = Path(path)
    return str(final.with_name(f".{final.name}.{pid}{TMP_SUFFIX}"))


def remove_temporaries(output: str, fs: Any | None = None) -> int:
    """Remove what writers killed before their rename left (local folders only: a ``gs://``
    object is never partial); returns how many."""
    if is_remote(output) or not Path(output).is_dir():
        return 0
    left = [
        p for p in Path(output).iterdir() if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX)
    ]
    for path in left:
        path.unlink(missing_ok=True)
    return len(left)


def encode_lines(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode("utf-8")


def part_path(output: str, chunk: int) -> str:
    return join(output, part_name(chunk))


@dataclass(frozen=True)
class JobIdentity:
    """What a batch job's outputs depend on: a folder of outputs holds one job's."""

    input_digest: str
    rows: int
    chunk_rows: int
    checkpoint: str
    max_new_tokens: int
    temperature: float
    seed: int


def input_digest(prompts: Sequence[Prompt]) -> str:
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps(asdict(p), sort_keys=True).encode("utf-8") + b"\n")
    return digest.hexdigest()[:16]


def check_job_file(field: str, output: str, identity: JobIdentity, fs: Any | None = None) -> bool:
    """Write the job file, or check the one there is the same job; refused (naming ``field``
    and the first differing key) when the folder holds another job's outputs. True: resumed."""
    fs = fs or filesystem(output)
    path = join(output, JOB_FILE)
    wanted = asdict(identity)
    if fs.exists(path):
        with fs.open(path, "rb") as handle:
            found = json.loads(handle.read().decode("utf-8"))
        for key, value in wanted.items():
            if found.get(key) != value:
                raise ValueError(
                    invalid(
                        field,
                        output,
                        "an empty folder, or one holding this same job's outputs",
                        reason=f"its {JOB_FILE} has {key}={found.get(key)!r}, this job {value!r}",
                    )
                )
        return True
    try:
        if not is_remote(output):
            Path(output).mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(wanted, sort_keys=True, indent=1).encode("utf-8"), fs)
    except OSError as error:
        valid = "a folder this user can create and write, or gs://BUCKET/PATH"
        raise ValueError(invalid(field, output, valid, reason=str(error))) from None
    return False


@dataclass(frozen=True)
class OutputCheck:
    """What the output folder holds: rows found per file, and any row missing or repeated."""

    files: int
    rows: int
    missing: tuple[int, ...]
    repeated: tuple[int, ...]
    stray: tuple[str, ...]
    """Files that are neither parts nor the job file (a temporary file left by a dead writer)."""

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.repeated)


def read_outputs(output: str, fs: Any | None = None) -> list[dict[str, Any]]:
    """Every output record, part after part."""
    fs = fs or filesystem(output)
    records: list[dict[str, Any]] = []
    for name in sorted(n for n in fs.ls(output, detail=False) if chunk_of(n) is not None):
        with fs.open(name, "rb") as handle:
            records += [json.loads(x) for x in handle.read().decode("utf-8").splitlines() if x]
    return records


def check_outputs(output: str, rows: int, fs: Any | None = None) -> OutputCheck:
    """Whether every row ``0..rows-1`` is in the output folder exactly once."""
    fs = fs or filesystem(output)
    names = fs.ls(output, detail=False)
    seen: dict[int, int] = {}
    for record in read_outputs(output, fs):
        seen[record["row"]] = seen.get(record["row"], 0) + 1
    base = [n.rstrip("/").rsplit("/", 1)[-1] for n in names]
    return OutputCheck(
        files=sum(chunk_of(n) is not None for n in names),
        rows=sum(seen.values()),
        missing=tuple(r for r in range(rows) if r not in seen),
        repeated=tuple(sorted(r for r, n in seen.items() if n > 1 or not 0 <= r < rows)),
        stray=tuple(
            sorted(b for b in base if chunk_of(b) is None and b != JOB_FILE and b[0] != "_")
        ),
    )
