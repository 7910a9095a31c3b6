"""`mlharness serve`: a model manifest served over the Open Inference Protocol (HTTP and gRPC), its
preprocess and postprocess on the server side, concurrent requests batched dynamically."""
