"""Pure analyzers (model + parameters + data in, result dataclass out) and their registry: one line per
analysis, its spec imported only when used (listing commands imports no torch)."""

from landscape.analyze.registry import register

register("interpolate", "landscape.analyze.specs:INTERPOLATE",
         "Loss/accuracy along (1-a)A + aB and its instability (Watson Def. 2.3).")
register("instability", "landscape.analyze.specs:INSTABILITY",
         "Instability of many checkpoint pairs: CSV + HDF5 + figure (Watson Fig. 5).")
register("ntk", "landscape.analyze.specs:NTK", "Empirical NTK under clipping: symmetry, positivity, spectra (Bu et al.).")
register("ntk-table", "landscape.analyze.specs:NTK_TABLE", "Bu et al. Table 1 measured at a checkpoint or along a run.")
register("clipping", "landscape.analyze.specs:CLIPPING",
         "Clipping ratio R and the Thm. 3.2 bound (Watson Sec. 3.1); --prune-levels for Fig. 11.")
register("symmetry", "landscape.analyze.specs:SYMMETRY",
         "Symmetry of per-sample gradient deviations (Zhu & Blaschko App. F).")
register("norms", "landscape.analyze.specs:NORMS",
         "Parameter and gradient norms of runs, distance ratios (Watson Figs. 16-17).")
register("directions", "landscape.analyze.specs:DIRECTIONS",
         "Loss along N random directions from A against the path toward B (Watson Fig. 4).")
register("surface", "landscape.analyze.specs:SURFACE",
         "2-D loss/accuracy surface: random, B,C or pca:RUN plane (Li et al. 2018); resumable.")
register("calibration", "landscape.analyze.specs:CALIBRATION",
         "Accuracy, NLL, Brier, ECE/MCE, reliability diagrams of checkpoints or runs (Bu et al. Sec. 5).")
register("hessian", "landscape.analyze.specs:HESSIAN",
         "Hessian sharpness: top eigenvalues, trace, spectral density (PyHessian; Ghorbani et al. 2019).")
