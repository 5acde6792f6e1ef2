"""``vitlab app``: the attention explorer served as a standalone page (Voila)."""

from __future__ import annotations

import argparse

from vitlab.cli.args import add_model_arguments, host_name, positive_int, tcp_port

NAME = 'app'
HELP = 'serve the attention explorer as a standalone page (Voila)'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--port", type=tcp_port, default=8866)
    parser.add_argument("--num-images", type=positive_int, default=8, help="embedded images to offer (default 8; at most "
                    "128 CIFAR-10 test images for 32 px models, 38 photo crops otherwise)")
    parser.add_argument("--open", action="store_true", help="open a browser")
    parser.add_argument("--max-pages", type=positive_int, default=3, help="most explorer pages (kernels, each holding "
                    "the model) alive at once (default 3); more are refused until one is closed or idle")
    parser.add_argument("--allow-host", action="append", default=[], type=host_name, metavar="NAME",
                    help="also serve requests whose Host header is NAME (default: only 127.0.0.1, ::1, localhost; "
                    "others are refused against DNS rebinding); repeatable")


def _check_app_model(model: str | None, num_images: int, pretrained: bool = True, weights: str | None = None) -> None:
    """Load ``model`` as the explorer's kernel will and check that it has attention to show and ``num_images`` of
    its default images, before any server starts."""
    from vitlab.data.images import default_image_count, default_source
    from vitlab.models.info import has_attention, model_info
    from vitlab.models.load import load_model

    net = load_model(model or None, pretrained=pretrained, weights=weights)
    try:
        model_info(net)
    except TypeError as e:
        what = "cannot be read by the explorer" if has_attention(net) else "has no self-attention for the explorer to show"
        raise ValueError(f"{model or 'the embedded default'} {what} ({e}): pass a ViT-family model") from e
    most = default_image_count(net)
    if num_images > most:
        raise ValueError(f"--num-images {num_images}: this model's images are {default_source(net)}, at most "
                         f"{most}")


def run(args: argparse.Namespace) -> int:
    import signal

    from vitlab.app import check_port, new_token, page_url, serve, stop

    check_port(args.port)  # before the model loads: Voila would otherwise serve on another port than the one named
    # here, with the CLI's message and exit status, not in the browser
    _check_app_model(args.model, args.num_images, args.pretrained, args.weights)
    token = new_token()  # as Jupyter's: another local user or a web page (DNS rebinding) cannot start kernels
    proc = serve(args.model, port=args.port, open_browser=args.open, num_images=args.num_images,
                 pretrained=args.pretrained, weights=args.weights, token=token, hosts=tuple(args.allow_host),
                 max_pages=args.max_pages)
    print(f"serving the attention explorer on {page_url(args.port, token)} (Ctrl-C or kill to stop)", flush=True)

    def on_term(_signum, _frame):  # kill (SIGTERM) stops the server and its kernels too, not only this process
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop(proc)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            stop(proc)
