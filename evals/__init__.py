"""`stoker eval-semantic`: labelled queries streamed through the semantic cache under static
thresholds and the verified matcher. data (the labelled streams) -> answers (a model server's,
kept on disk, or the simulator's) -> semantic (the protocol) -> score / report; candidates and
checks measure label-free signals side by side. Labels only score."""
