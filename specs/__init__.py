"""The manifests shipped with mlharness (DLSpec YAML in models/, datasets/, software/, hardware/,
references/). A package so that they install with the code as package data and are found with
importlib.resources, from a checkout or a wheel alike (mlharness.specs.index.specs_root); $MLHARNESS_SPECS
points elsewhere."""
