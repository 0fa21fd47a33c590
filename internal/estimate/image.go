package estimate

import (
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	_ "image/jpeg" // DecodeConfig of image/jpeg
	_ "image/png"  // DecodeConfig of image/png
	"strings"
)

// OpenAITileTokens is the cost of one 512 px tile at high detail; OpenAIBaseTokens is
// added once per image, and is the whole cost at low detail.
const (
	OpenAIBaseTokens = 85
	OpenAITileTokens = 170
)

// OpenAIImageTokens is OpenAI's documented cost of a w×h image: at low detail 85; at high
// (and auto, counted as high) the image is fitted in 2048×2048, then its shortest side is
// brought down to 768, and it costs 85 + 170 per 512 px tile.
func OpenAIImageTokens(w, h int64, detail string) int64 {
	if detail == "low" {
		return OpenAIBaseTokens
	}
	if long := max(w, h); long > 2048 {
		w, h = w*2048/long, h*2048/long
	}
	if short := min(w, h); short > 768 {
		w, h = w*768/short, h*768/short
	}
	tiles := ((w + 511) / 512) * ((h + 511) / 512)
	return OpenAIBaseTokens + OpenAITileTokens*tiles
}

// AnthropicImageTokens is Anthropic's documented cost of a w×h image: an image whose long
// edge is over 1568 px is scaled down to it, then it costs width×height/750 tokens (rounded
// up), at most UnknownImageAnthropic (larger images are scaled down to about that).
func AnthropicImageTokens(w, h int64) int64 {
	if long := max(w, h); long > 1568 {
		w, h = max(1, w*1568/long), max(1, h*1568/long)
	}
	return min((w*h+749)/750, UnknownImageAnthropic)
}

func openAIImage(url, detail string) (int64, error) {
	switch detail {
	case "", "auto", "high", "low":
	default:
		return 0, fmt.Errorf("image_url.detail %q is not low, high or auto", detail)
	}
	if detail == "low" {
		return OpenAIBaseTokens, nil
	}
	if !strings.HasPrefix(url, "data:") {
		return UnknownImageOpenAI, nil // a remote image is not fetched
	}
	media, data, ok := strings.Cut(strings.TrimPrefix(url, "data:"), ",")
	if !ok {
		return 0, errors.New("a data: URL without a comma")
	}
	media, isBase64 := strings.CutSuffix(media, ";base64")
	if !isBase64 {
		return UnknownImageOpenAI, nil
	}
	w, h, known, err := imageSize(media, data)
	if err != nil || !known {
		return UnknownImageOpenAI, err
	}
	return OpenAIImageTokens(w, h, detail), nil
}

func anthropicImage(kind, media, data string) (int64, error) {
	switch kind {
	case "base64":
		w, h, known, err := imageSize(media, data)
		if err != nil || !known {
			return UnknownImageAnthropic, err
		}
		return AnthropicImageTokens(w, h), nil
	case "url", "file":
		return UnknownImageAnthropic, nil // not fetched
	}
	return 0, fmt.Errorf("image.source.type %q is not base64, url or file", kind)
}

// imageSize reads a PNG's or JPEG's size from its header, decoding only the base64 that
// covers it. known is false for other formats.
func imageSize(media, data string) (w, h int64, known bool, err error) {
	if media != "image/png" && media != "image/jpeg" {
		return 0, 0, false, nil
	}
	cfg, format, err := image.DecodeConfig(base64.NewDecoder(base64.StdEncoding, strings.NewReader(data)))
	if err != nil {
		return 0, 0, false, fmt.Errorf("not a readable %s: %w", media, err)
	}
	if "image/"+format != media {
		return 0, 0, false, fmt.Errorf("%s data is a %s image", media, format)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false, fmt.Errorf("%s of %d×%d pixels", media, cfg.Width, cfg.Height)
	}
	return int64(cfg.Width), int64(cfg.Height), true, nil
}
