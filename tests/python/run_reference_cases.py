"""Runs scripts/xlme_reference.py, as its command line does, once per case in one process (driven
by tests/integration/export_parity_test.cpp): importing torch costs more than a tiny export's
forward pass, so that a process per case would spend most of its time starting.

    run_reference_cases.py CASES.json

CASES.json is a list of {"name": NAME, "args": [ARG, ...]} (xlme_reference.py's arguments). Each
case runs as `python scripts/xlme_reference.py ARGS...` would, as __main__ with sys.argv set, and
prints one JSON line {"case": NAME, "code": EXIT_CODE, "output": STDOUT_AND_STDERR}. Exits 0 once
every case ran, whatever their codes: the caller checks each.
"""
import contextlib
import io
import json
import os
import runpy
import sys
import traceback

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "xlme_reference.py")


def run_case(args):
    """xlme_reference.py's exit code and output for `args`."""
    out = io.StringIO()
    code = 0
    sys.argv = [SCRIPT] + args
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(SCRIPT, run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if exit_.code is not None and not isinstance(exit_.code, int):
                print(exit_.code, file=out)
        except Exception:  # a traceback is the case's failure, not the runner's
            traceback.print_exc(file=out)
            code = 1
    return code, out.getvalue()


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    for case in cases:
        code, output = run_case(case["args"])
        print(json.dumps({"case": case["name"], "code": code, "output": output}), flush=True)


if __name__ == "__main__":
    main()
