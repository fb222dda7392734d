"""Every Pulumi ComponentResource of the program, one per file."""
