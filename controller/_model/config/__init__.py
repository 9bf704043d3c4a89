"""What users write: the configs, each block's checks, manifests, applications, a change's cause."""
