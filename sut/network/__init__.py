"""Clients of remote model servers (network SUTs): the endpoint address, the Open Inference Protocol's
tensors and its HTTP and gRPC clients, and the SUT that forwards LoadGen's queries to a server through
LoadGen's query dispatch library (ConstructQDL). Nothing here batches, caches or pre- or
post-processes a sample: MLPerf's network division leaves that to the server."""
