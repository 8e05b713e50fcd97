"""Hardware fault watching for the load commands (bench, comm, stress): each rank's
`FaultWatch` result goes to rank 0, which makes findings (`fault_findings`) or the
"faults" section (`run_faults_section`). docs/faults.md has every counter and action."""

from gpucheck.faults.clocks import slowdown_causes
from gpucheck.faults.findings import fault_findings, faults_section, gpu_names, run_faults_section
from gpucheck.faults.watch import FaultWatch

__all__ = ["FaultWatch", "fault_findings", "faults_section", "gpu_names",
           "run_faults_section", "slowdown_causes"]
