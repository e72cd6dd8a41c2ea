"""Before partitioning: constant subgraphs folded, dynamic outputs padded to their bound."""
