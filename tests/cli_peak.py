"""The CLI as `python -m spotlight.cli` runs it, for tests that measure a command's peak memory.

The child writes its peak RSS (VmHWM: the memory map its exec made, nothing inherited) to the file
named first on its command line when it exits. Not `ru_maxrss` from wait4: Linux carries the forking
process's high-water mark into the child through fork and exec (tests/spotlight/test_bad_input.py)."""

PEAK_REPORTING_CLI = """
import atexit, runpy, sys
peak_file = sys.argv.pop(1)

def report():
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(peak_file, "w") as out:
        out.write(peak)

atexit.register(report)
sys.argv[0] = "spotlight"
runpy.run_module("spotlight.cli", run_name="__main__", alter_sys=True)
"""
