"""Hardware families behind one `Target` / `Network` interface: TPU slices (``tpu``) and GPU
boxes and clusters (``gpu``, ``topology_files`` for a user's own box). ``records`` holds the
family-neutral records every family fills."""
