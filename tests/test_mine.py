"""The switch at the ground floor (dist_sgd/plumbing/mine.py), in this process: off, it changes
nothing; on, a learner's file replaces exactly the names the module offers; DIST_SGD_MINE_ONLY
selects by name or lesson number; a file missing a name is refused, naming it. The switch end
to end (lessons, spawned ranks, the course command) is tests/test_course.py's."""
import pytest

from dist_sgd.plumbing import mine


def offer(namespace):
    """What a module holding exercise 'piece' of lesson 42 does at its end."""
    return mine.swap_in(namespace, "piece", ("f", "G"), lesson="42")


@pytest.fixture
def switch(tmp_path, monkeypatch):
    for name in (mine.MINE, mine.ONLY, mine.QUIET):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "piece.py").write_text("def f():\n    return 'mine'\n\nclass G:\n    pass\n\n"
                                       "def helper():\n    return 1\n")
    return tmp_path


def test_off_the_module_keeps_its_own(switch):
    namespace = {"f": "library's", "G": "library's"}
    assert offer(namespace) is None and namespace == {"f": "library's", "G": "library's"}


def test_on_the_learners_names_replace_the_offered_ones_only(switch, monkeypatch, capsys):
    monkeypatch.setenv(mine.MINE, str(switch))
    namespace = {"f": "library's", "G": "library's"}
    module = offer(namespace)
    assert namespace["f"]() == "mine" and namespace["G"].__name__ == "G"
    assert "helper" not in namespace and module.helper() == 1  # only what the module offers
    assert "using f, G from" in capsys.readouterr().err
    offer({})
    assert capsys.readouterr().err == "", "a process says it once"


@pytest.mark.parametrize("only,swapped", [("piece", True), ("42", True), ("other,42", True),
                                          ("other", False), ("41", False)])
def test_only_selects_by_name_or_lesson(switch, monkeypatch, only, swapped):
    monkeypatch.setenv(mine.MINE, str(switch))
    monkeypatch.setenv(mine.ONLY, only)
    namespace = {"f": "library's", "G": "library's"}
    offer(namespace)
    assert (namespace["f"] != "library's") == swapped


def test_a_file_without_an_offered_name_is_refused_by_name(switch, monkeypatch):
    monkeypatch.setenv(mine.MINE, str(switch))
    (switch / "piece.py").write_text("def f():\n    return 'mine'\n")
    namespace = {"f": "library's", "G": "library's"}
    with pytest.raises(ImportError, match=r"piece.py must define G .*`start piece`"):
        offer(namespace)
    assert namespace == {"f": "library's", "G": "library's"}, "refused: nothing replaced"
