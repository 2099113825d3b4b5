import io

import pytest
from PIL import Image

from reference.imaging import ImageRejected, Limits, render_variants
from reference.keys import attachment_id_from_staging_key, fencing_token_of_variant_key, staging_key, variant_key


def jpeg_with_exif_orientation(size=(300, 200), orientation=6) -> bytes:
    image = Image.new("RGB", size, (10, 200, 10))
    exif = Image.Exif()
    exif[0x0112] = orientation  # rotate 90° clockwise on display
    exif[0x010F] = "SecretCameraMaker"
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif.tobytes())
    return buffer.getvalue()


def test_renders_all_level_4_variants_as_webp():
    out = render_variants(jpeg_with_exif_orientation(orientation=1), ("thumbnail", "crop", "optimized"), Limits())
    assert [v.name for v in out] == ["thumbnail", "crop", "optimized"]
    for variant in out:
        assert variant.content_type == "image/webp"
        assert Image.open(io.BytesIO(variant.data)).format == "WEBP"
    thumbnail, crop, optimized = out
    assert max(thumbnail.width, thumbnail.height) == 256
    assert crop.width == crop.height == 200
    assert (optimized.width, optimized.height) == (300, 200)


def test_exif_transpose_applied_and_metadata_stripped():
    (variant,) = render_variants(jpeg_with_exif_orientation(orientation=6), ("optimized",), Limits())
    assert (variant.width, variant.height) == (200, 300)
    decoded = Image.open(io.BytesIO(variant.data))
    assert not decoded.getexif() and "exif" not in decoded.info and "icc_profile" not in decoded.info
    assert b"SecretCameraMaker" not in variant.data


def test_rendering_is_deterministic():
    data = jpeg_with_exif_orientation()
    first = render_variants(data, ("thumbnail", "crop", "optimized"), Limits())
    second = render_variants(data, ("thumbnail", "crop", "optimized"), Limits())
    assert [v.data for v in first] == [v.data for v in second]


def test_pixel_and_frame_caps_are_permanent_errors():
    buffer = io.BytesIO()
    Image.new("RGB", (100, 100)).save(buffer, format="PNG")
    with pytest.raises(ImageRejected) as info:
        render_variants(buffer.getvalue(), ("thumbnail",), Limits(max_pixels=5000))
    assert info.value.code == "too_many_pixels"
    frames = [Image.new("RGB", (10, 10), (i * 50, 0, 0)) for i in range(5)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(ImageRejected) as info:
        render_variants(buffer.getvalue(), ("thumbnail",), Limits(max_frames=3))
    assert info.value.code == "too_many_frames"


def test_undecodable_data_is_a_permanent_error():
    buffer = io.BytesIO()
    Image.new("RGB", (200, 200), (1, 2, 3)).save(buffer, format="PNG")
    data = bytearray(buffer.getvalue())
    start = data.index(b"IDAT") + 4
    data[start:start + 20] = b"\x00" * 20  # corrupt the zlib stream
    with pytest.raises(ImageRejected) as info:
        render_variants(bytes(data), ("thumbnail",), Limits())
    assert info.value.code == "decode_failed"


def test_keys_are_server_generated_and_deterministic():
    attachment = "5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e"
    assert staging_key(attachment) == f"staging/{attachment}"
    assert variant_key(attachment, 1, "crop", "webp") == f"variants/{attachment}/v1/crop.webp"
    # A key per claim: the fencing token fences object writes (a stale owner never writes what ready names).
    assert variant_key(attachment, 1, "crop", "webp", 7) == f"variants/{attachment}/v1/t7/crop.webp"
    assert fencing_token_of_variant_key(f"variants/{attachment}/v1/t7/crop.webp") == 7
    assert fencing_token_of_variant_key(f"variants/{attachment}/v1/crop.webp") is None
    assert attachment_id_from_staging_key(f"staging/{attachment}").hex == attachment.replace("-", "")
    assert attachment_id_from_staging_key("staging/../../x.jpg") is None
    with pytest.raises(ValueError):
        staging_key("../../x.jpg")


def test_draft_rule_only_when_every_variant_is_much_smaller():
    from reference.imaging import draft_request

    everything = ("thumbnail", "crop", "optimized")
    assert draft_request((1600, 1200), everything) is None  # the optimized variant is the full image
    assert draft_request((4032, 3024), everything) is None  # optimized 2048 is more than 1/2.5 of the side
    assert draft_request((6000, 4000), everything) == (2560, 1707)
    assert draft_request((4000, 6000), everything) == (1707, 2560)  # rotation-invariant: every box is square
    assert draft_request((1600, 1200), ("thumbnail",)) == (320, 240)
    assert draft_request((1600, 1200), ("thumbnail", "crop")) is None  # the crop keeps 512 of a 1200 short side


def test_draft_decode_keeps_variant_dimensions_orientation_and_determinism():
    from reference import imaging

    image = Image.linear_gradient("L").resize((5200, 2600)).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85, exif=exif.tobytes())
    data = buffer.getvalue()
    everything = ("thumbnail", "crop", "optimized")
    decoded, original = imaging._load(data, Limits(), everything)
    assert decoded.size == (1300, 2600) and original == (2600, 5200)  # decoded at 1/2, then rotated
    drafted = render_variants(data, everything, Limits())
    full = render_variants(data, everything, Limits(), draft=False)
    assert [(v.width, v.height) for v in drafted] == [(v.width, v.height) for v in full] == [
        (128, 256), (512, 512), (1024, 2048)]
    assert [v.data for v in drafted] == [v.data for v in render_variants(data, everything, Limits())]


def test_previous_settings_are_still_reachable_for_the_benchmark():
    data = jpeg_with_exif_orientation(size=(600, 400), orientation=1)
    old = render_variants(data, ("optimized",), Limits(), methods={"optimized": 4}, draft=False)
    new = render_variants(data, ("optimized",), Limits())
    assert (old[0].width, old[0].height) == (new[0].width, new[0].height) == (600, 400)
    assert old[0].data != new[0].data  # method 4 before, the chosen method now
