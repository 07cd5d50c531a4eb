"""Attribute groups: a prompt too wide for the model's sliding window is decoded as several.

HPD leaves K_max positions after every key, so the slots of a category with many attributes lie
far, in positions, from their product's text: past a sliding window (Gemma 3: 512 positions, five
layers in six), where those layers see none of the text (``layout.beyond_window``; at K_max 30 that
is after about 14 attributes, and measured on the validation products with 20 attributes put
first, F1 fell from 81.6 to 3.6: docs/sliding-window.md). Such a request is decoded as requests
over consecutive groups of its attributes, each group as wide as the window allows, with the same
products, and the groups' results are merged back into one result per request. With the
interleaved skeleton a product's text ends a few tokens (``Layout.key_tails``) before its first key,
so a group whose value tokens begin within the window of that text's end is in sight of it; the
after-products skeleton, whose keys follow all the products, is not split (its slots count in
``beyond_window`` as before).

A request that fits (every request of a model without sliding layers) is passed through as the
same object, so nothing changes for it: its prompt, positions and values are as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hpd_core.batching import error_result
from hpd_core.layout import Layout
from hpd_core.types import Request, Result


def ranges(layout: Layout, window: int | None) -> list[tuple[int, int]]:
    """Consecutive attribute ranges ``[start, end)`` whose first value tokens all lie less than
    ``window`` positions after the product's text, were the range's first key the product's first
    (read off the first product's anchors and ``key_tails``; every product's keys are the same
    tokens). One range for a layout that fits, and for one of the after-products skeleton (no
    ``key_tails``: its keys follow all the products, so no group would bring them near their text);
    a single attribute is a range of its own even where its own key is wider than the window."""
    n = layout.num_attributes
    if window is None or not layout.key_tails:
        return [(0, n)]
    anchors, tails = layout.anchor_pos[:n], layout.key_tails
    out, start = [], 0
    for b in range(1, n):
        if anchors[b] + 1 - anchors[start] + tails[start] >= window:  # from the text, before the group's first key
            out.append((start, b))
            start = b
    return out + [(start, n)]


@dataclass(frozen=True)
class Split:
    """The requests as decoded (``requests``, ``layouts``): each original request, or its groups.
    ``whole[i]`` is the original request of decoded request i and ``start[i]`` its first attribute."""

    originals: list[Request]
    requests: list[Request]
    layouts: list[Layout]
    whole: list[int]
    start: list[int]
    forced: list | None = None  # teacher forcing (hpd bench's fixed lengths): each decoded request's slots

    @property
    def any(self) -> bool:
        return len(self.requests) > len(self.originals)

    def telling(self, hook: Callable[[Request], None] | None) -> Callable[[Request], None] | None:
        """A progress hook for the decoded requests that tells ``hook`` each original request once,
        when the last of its groups has finished."""
        if hook is None or not self.any:
            return hook
        index = {id(r): i for i, r in enumerate(self.requests)}
        left = [0] * len(self.originals)
        for w in self.whole:
            left[w] += 1

        def done(request: Request) -> None:
            w = self.whole[index[id(request)]]
            left[w] -= 1
            if left[w] == 0:
                hook(self.originals[w])

        return done

    def merge(self, results: list[Result]) -> list[Result]:
        """One result per original request: its groups' values side by side in attribute order,
        their counters summed; an error if any group failed."""
        if not self.any:
            return results
        parts: list[list[tuple[int, Result]]] = [[] for _ in self.originals]
        for i, result in enumerate(results):
            parts[self.whole[i]].append((self.start[i], result))
        return [merged(original, sorted(p, key=lambda sr: sr[0])) for original, p in zip(self.originals, parts)]


def merged(original: Request, parts: list[tuple[int, Result]]) -> Result:
    """The result of ``original`` from its groups' results, ordered by first attribute."""
    results = [r for _, r in parts]
    if len(results) == 1:
        return replace(results[0], request=original)
    prompt_tokens = sum(r.prompt_tokens for r in results)
    failed = next((r for r in results if r.error is not None), None)
    if failed is not None:
        return error_result(original, failed.decoder, f"{failed.error} (one of {len(results)} attribute groups)",
                            prompt_tokens)
    values = tuple(sum((r.values[j] for r in results), ()) for j in range(len(original.products)))
    slot_tokens = []
    for j in range(len(original.products)):  # product-major, as the decoders give them
        for r in results:
            n = len(r.request.attributes)
            slot_tokens += r.extra["slot_tokens"][j * n : (j + 1) * n]
    return Result(
        request=original,
        values=values,
        prompt_tokens=prompt_tokens,
        generated_tokens=sum(r.generated_tokens for r in results),
        forward_passes=sum(r.forward_passes for r in results),
        decoder=results[0].decoder,
        extra={"slot_tokens": slot_tokens, "beyond_window": sum(r.extra.get("beyond_window", 0) for r in results),
               "groups": len(results)},
    )


def split(requests: list[Request], layouts: list[Layout], window: int | None,
          prepare: Callable[[list[Request]], list[Layout]], forced: list | None = None) -> Split:
    """Each request whose layout passes ``window`` as requests over its attribute groups (laid out
    by ``prepare``); the others as they are. Only the interleaved skeleton is split (``ranges``).
    ``forced[r][s]`` (teacher forcing, product-major slots) is split alike."""
    out_requests, out_layouts, whole, start, out_forced = [], [], [], [], []
    for i, (request, layout) in enumerate(zip(requests, layouts)):
        cut = ranges(layout, window)
        n = layout.num_attributes
        if len(cut) == 1:
            out_requests.append(request)
            out_layouts.append(layout)
            whole.append(i)
            start.append(0)
            out_forced.append(forced[i] if forced is not None else None)
            continue
        parts = [replace(request, attributes=request.attributes[a:b]) for a, b in cut]
        out_requests += parts
        out_layouts += prepare(parts)
        whole += [i] * len(parts)
        start += [a for a, _ in cut]
        if forced is not None:
            out_forced += [[forced[i][j * n + s] for j in range(len(request.products)) for s in range(a, b)] for a, b in cut]
    return Split(list(requests), out_requests, out_layouts, whole, start, out_forced if forced is not None else None)


def split_example(example, layout: Layout, window: int | None) -> list:
    """A training example (``collate.Example``: a request and its values) whose layout passes
    ``window``, as examples over its attribute groups, as ``split`` decodes it; else the example.
    The trainer lays out what the engine decodes, so a wide category trains as it is extracted."""
    cut = ranges(layout, window)
    if len(cut) == 1:
        return [example]
    request = example.request
    return [replace(example, request=replace(request, attributes=request.attributes[a:b]),
                    values=tuple(row[a:b] for row in example.values),
                    scored=None if example.scored is None else tuple(row[a:b] for row in example.scored)) for a, b in cut]
