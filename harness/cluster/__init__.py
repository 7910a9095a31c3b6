"""Sweeps across machines on Ray (docs/cluster.md): `mlharness node` starts or joins a Ray node that
advertises its hardware as custom resources (`mlharness.cluster.resources`), and `mlharness sweep GRID
--cluster ADDRESS` runs each cell as a Ray task on a node matching the cell's hardware manifest
(`mlharness.cluster.ray_launcher`, `mlharness.cluster.scheduler`). Ray is an optional extra
(`pip install 'mlharness[cluster]'`) and is imported only when a cluster is used."""
