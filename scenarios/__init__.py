"""The scenario presets shipped with mlharness (`--quick`, `--preset NAME`: scenarios/*.yaml). A
package so that they install with the code as package data and are found with importlib.resources
(mlharness.running.settings.scenarios_root); $MLHARNESS_SCENARIOS points elsewhere."""
