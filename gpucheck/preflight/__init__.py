"""`gpucheck preflight`: the checks in the job's own launch, then the job's command."""
