"""Scale-out on Slurm: a collection as an array job of plan shards, merged by a dependent job."""
