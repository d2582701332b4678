"""`splitserve provision`: the cheapest, lowest-power or highest-throughput cluster that meets the SLOs."""
