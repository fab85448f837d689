"""DeFINE (Mehta et al., 2020): the hierarchical group transformation, the embedding built on it, the authors' DeLighT
unit and the grouped linear layer."""
