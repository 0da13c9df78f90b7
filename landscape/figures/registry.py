"""Registry of the paper-figure recipes: one line per recipe, ``name -> module`` (imported on use)."""

from __future__ import annotations

import importlib

from landscape.errors import UsageError

SCALES = ("test", "cpu", "paper")  # seconds, minutes on a laptop, the paper's data set and model

RECIPES: dict[str, str] = {  # paper order
    "watson-fig2": "landscape.figures.watson_fig2",
    "watson-fig3": "landscape.figures.watson_fig3",
    "watson-fig4": "landscape.figures.watson_fig4",
    "watson-fig5": "landscape.figures.watson_fig5",
    "watson-fig6-7": "landscape.figures.watson_fig6_7",
    "watson-fig8": "landscape.figures.watson_fig8",
    "watson-fig9": "landscape.figures.watson_fig9",
    "watson-fig10": "landscape.figures.watson_fig10",
    "watson-fig11": "landscape.figures.watson_fig11",
    "watson-fig13": "landscape.figures.watson_fig13",
    "watson-fig16-17": "landscape.figures.watson_fig16_17",
    "watson-thm33": "landscape.figures.watson_thm33",
    "bu-table1": "landscape.figures.bu_table1",
    "bu-fig6-7": "landscape.figures.bu_fig6_7",
    "bu-fig11": "landscape.figures.bu_fig11",
    "zhu-figF": "landscape.figures.zhu_figF",
    "zhu-fig2": "landscape.figures.zhu_fig2",
    "wang-lssgd": "landscape.figures.wang_lssgd",
}


def names() -> list[str]:
    return list(RECIPES)


def get(name: str):
    if name not in RECIPES:
        raise UsageError(f"unknown recipe {name!r}; see `landscape figures --list`")
    return importlib.import_module(RECIPES[name]).RECIPE
