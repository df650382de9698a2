"""The written-out chain the per-stage probes here run (`thread_cpu.py`, `syscalls.py`,
`timeline.py`, `plan_memory.py`): N stages running `true`, each `s{i}` after `s{i-1}`."""


def write_chain_plan(n, path, header=""):
    """Writes the chain of `n` stages to `path`, after `header` (TOML lines, e.g. a `[run]`
    table)."""
    with open(path, "w") as f:
        f.write(header)
        for i in range(n):
            f.write(f'[[stage]]\nname = "s{i}"\ncommand = ["true"]\n')
            if i:
                f.write(f'after = ["s{i - 1}"]\n')
