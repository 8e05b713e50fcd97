"""Hardware fault watching for the load commands (bench, comm, stress).

Each rank watches the GPU it uses with `FaultWatch` (counters before/after, NVML
XID/ECC events and clock-event reasons during the run) and sends
`watch.result()`, a plain JSON-able dict, with its record to rank 0, which turns
all of them into findings with `fault_findings` or a report section with
`faults_section`. docs/faults.md has every counter, threshold and action.
`slowdown_causes` says which ranks' clocks were held down, for straggler findings.
The load commands get the watch from their distributed frame
(`gpucheck.distributed.faultwatch`) and their section from `run_faults_section`.
"""

from gpucheck.faults.findings import fault_findings, faults_section, slowdown_causes
from gpucheck.faults.load import gpu_names, run_faults_section
from gpucheck.faults.watch import FaultWatch

__all__ = ["FaultWatch", "fault_findings", "faults_section", "gpu_names",
           "run_faults_section", "slowdown_causes"]
