"""What a grid costs and asks for before it is submitted: GPU-hour estimates and each job's SLURM resources."""
